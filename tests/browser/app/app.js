// A small application served by the Core at /ui/app/: it uses the API the way the
// dashboard does (same origin, the session cookie, /ui/api/*), never a token.
"use strict";

async function models() {
  const frame = {protocol: "arcane/1", type: "request", id: "m", method: "models.list", parameters: {}};
  const response = await fetch("/ui/api/rpc", {
    method: "POST",
    headers: {"Content-Type": "application/json"},
    body: JSON.stringify(frame),
  });
  const answer = await response.json();
  return answer.result.models.map((model) => model.id);
}

async function chat(model) {
  const response = await fetch("/ui/api/chat/completions", {
    method: "POST",
    headers: {"Content-Type": "application/json"},
    body: JSON.stringify({model, stream: true, max_tokens: 16,
      messages: [{role: "user", content: "Say hello."}]}),
  });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const answer = document.getElementById("answer");
  let reads = 0;
  let buffered = "";
  for (;;) {
    const {done, value} = await reader.read();
    if (done) break;
    reads += 1;
    buffered += decoder.decode(value, {stream: true});
    const lines = buffered.split("\n");
    buffered = lines.pop();
    for (const line of lines) {
      const data = line.startsWith("data: ") ? line.slice(6) : "";
      if (!data || data === "[DONE]") continue;
      const delta = JSON.parse(data).choices[0].delta.content;
      if (delta) answer.textContent += delta;
    }
  }
  answer.dataset.reads = String(reads);
  answer.dataset.done = "true";
}

async function main() {
  try {
    const ids = await models();
    document.getElementById("models").textContent = ids.join(", ");
    await chat(ids[0]);
  } catch (error) {
    document.body.dataset.error = String(error);
  }
}
main();
