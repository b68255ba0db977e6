// The official `openai` npm client against Arcane's front door. Environment as
// openai_client.py (ARCANE_BASE_URL, ARCANE_TOKEN, ARCANE_MODEL, and optionally
// ARCANE_EMBED_BASE_URL / ARCANE_EMBED_MODEL / ARCANE_EMBED_TOKEN); NODE_PATH names the client's
// node_modules. Exits non-zero with a message on the first failure.
const OpenAI = require("openai");

const { ARCANE_BASE_URL: baseURL, ARCANE_TOKEN: apiKey, ARCANE_MODEL: model } = process.env;

function check(name, condition, detail) {
  if (!condition) {
    console.error(`FAILED ${name}: ${JSON.stringify(detail)}`);
    process.exit(1);
  }
  console.log(`ok ${name}`);
}

async function main() {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
  const listed = [];
  for await (const m of client.models.list()) listed.push(m.id);
  check("models.list", listed.includes(model), listed);
  const retrieved = await client.models.retrieve(model);
  check("models.retrieve", retrieved.id === model, retrieved);

  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Count to five." }], max_tokens: 16, stream: true,
  });
  const pieces = [];
  for await (const chunk of stream) {
    const delta = chunk.choices?.[0]?.delta?.content;
    if (delta) pieces.push(delta);
  }
  check("chat.completions stream", pieces.length >= 2, pieces);

  const response = await client.responses.create({ model, input: "Say hi.", max_output_tokens: 8 });
  check("responses.create", Boolean(response.output_text), response);

  if (process.env.ARCANE_EMBED_BASE_URL) {
    const embedder = new OpenAI({
      baseURL: process.env.ARCANE_EMBED_BASE_URL,
      apiKey: process.env.ARCANE_EMBED_TOKEN || apiKey,
      maxRetries: 0,
    });
    const result = await embedder.embeddings.create({ model: process.env.ARCANE_EMBED_MODEL, input: ["red apple", "green pear"] });
    check("embeddings.create", result.data.length === 2 && result.data[0].embedding.length > 16, result.data.length);
  }

  try {
    await new OpenAI({ baseURL, apiKey: "wrong-token-0123456789", maxRetries: 0 }).models.list();
    check("wrong token", false, "no error");
  } catch (error) {
    check("wrong token", error.status === 401, String(error));
  }
}

main().catch((error) => {
  console.error(`FAILED: ${error.stack || error}`);
  process.exit(1);
});
