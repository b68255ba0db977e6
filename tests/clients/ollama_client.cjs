// The official `ollama` npm client against Arcane's front door (Ollama's API).
// Environment as tests/clients/ollama_client.py. Prints one `ok <check>` per check.
const { Ollama } = require("ollama");

const root = process.env.ARCANE_ROOT_URL;
const token = process.env.ARCANE_TOKEN;
const model = process.env.ARCANE_MODEL;
const embedModel = process.env.ARCANE_EMBED_MODEL;
const tagged = `${model}:latest`;

function check(name, condition, detail) {
  if (!condition) {
    console.log(`FAILED ${name}: ${JSON.stringify(detail)}`);
    process.exit(1);
  }
  console.log(`ok ${name}`);
}

async function main() {
  const client = new Ollama({ host: root, headers: { Authorization: `Bearer ${token}` } });
  const listed = await client.list();
  check("list", listed.models.some((m) => m.model === tagged), listed);
  const shown = await client.show({ model: tagged });
  check("show", shown.capabilities.includes("completion") && shown.model_info["llama.context_length"] > 0, shown);
  const chat = await client.chat({ model, messages: [{ role: "user", content: "Say hi." }], options: { num_predict: 8 } });
  check("chat", chat.done && chat.message.content.length > 0 && chat.eval_count > 0, chat);
  const parts = [];
  for await (const part of await client.chat({
    model,
    messages: [{ role: "user", content: "Count to five." }],
    options: { num_predict: 12 },
    stream: true,
  })) {
    parts.push(part);
  }
  const last = parts[parts.length - 1];
  check("chat stream", parts.length > 2 && last.done && last.eval_count > 0, parts);
  const running = await client.ps();
  check("ps", running.models.some((m) => m.model === tagged && m.size_vram === 0), running);
  const generated = await client.generate({ model, prompt: "The sky is", options: { num_predict: 6 } });
  check("generate", generated.done && generated.response.length > 0 && Array.isArray(generated.context), generated);
  const pieces = [];
  for await (const part of await client.generate({ model, prompt: "One, two,", raw: true, stream: true, options: { num_predict: 6 } })) {
    pieces.push(part);
  }
  const final = pieces[pieces.length - 1];
  check("generate stream", final.done && pieces.length > 1 && Array.isArray(final.context), pieces);
  const embedded = await client.embed({ model: embedModel, input: ["hello", "world"] });
  check("embed", embedded.embeddings.length === 2 && embedded.embeddings[0].length > 0, embedded);
  try {
    await client.chat({ model: "no-such-model", messages: [{ role: "user", content: "hi" }] });
    check("unknown model", false, "no error");
  } catch (error) {
    check("unknown model", error.status_code === 404 && error.error.includes(tagged), String(error));
  }
  const wrong = new Ollama({ host: root, headers: { Authorization: "Bearer wrong-token" } });
  try {
    await wrong.list();
    check("wrong token", false, "no error");
  } catch (error) {
    // Ollama's shape (`error` a string, not `[object Object]`), saying where the token is.
    const said = error.error;
    check("wrong token", error.status_code === 401 && typeof said === "string" && said.includes("arcane token show"), said);
  }
}

main().catch((error) => {
  console.log(`FAILED: ${error && error.stack ? error.stack : error}`);
  process.exit(1);
});
