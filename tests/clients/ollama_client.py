"""The official `ollama` Python client against Arcane's front door (Ollama's API).

Environment: ARCANE_ROOT_URL (the Core's root URL), ARCANE_TOKEN, ARCANE_MODEL (a chat
model id, listed as `ID:latest`), ARCANE_EMBED_MODEL (a model started with
`--embeddings`). Exits non-zero with a message on the first failure; prints one
`ok <check>` line per check.
"""
import json
import os
import sys

import ollama

root, token, model, embed_model = (
    os.environ[k] for k in ("ARCANE_ROOT_URL", "ARCANE_TOKEN", "ARCANE_MODEL", "ARCANE_EMBED_MODEL")
)
client = ollama.Client(host=root, headers={"Authorization": f"Bearer {token}"}, timeout=120)
tagged = f"{model}:latest"


def check(name, condition, detail=""):
    if not condition:
        sys.exit(f"FAILED {name}: {detail}")
    print(f"ok {name}", flush=True)


listed = client.list()
names = [m.model for m in listed.models]
check("list", tagged in names and f"{embed_model}:latest" in names, listed)
entry = next(m for m in listed.models if m.model == tagged)
check(
    "list details",
    entry.details.format == "gguf"
    and entry.details.family == "llama"
    and entry.details.quantization_level == "Q4_1"
    and entry.size > 0
    and entry.digest
    and len(entry.digest) == 64,
    entry,
)

shown = client.show(tagged)
check(
    "show",
    shown.modelinfo.get("llama.context_length", 0) > 0
    and "completion" in shown.capabilities
    and bool(shown.template)
    and shown.details.family == "llama",
    shown,
)

chat = client.chat(
    model=model, messages=[{"role": "user", "content": "Say hi."}], options={"num_predict": 8, "temperature": 0}, stream=False
)
check(
    "chat",
    chat.done
    and chat.message.role == "assistant"
    and bool(chat.message.content)
    and chat.eval_count > 0
    and chat.prompt_eval_count > 0
    and chat.eval_duration > 0
    and chat.total_duration > 0
    and chat.done_reason in ("stop", "length"),
    chat,
)

pieces = list(
    client.chat(model=tagged, messages=[{"role": "user", "content": "Count to five."}], options={"num_predict": 12}, stream=True)
)
text = "".join(p.message.content for p in pieces)
last = pieces[-1]
check(
    "chat stream",
    len(pieces) > 2 and text and all(not p.done for p in pieces[:-1]) and last.done and last.eval_count > 0 and last.eval_duration > 0,
    pieces,
)

running = client.ps()
loaded = [m for m in running.models if m.model == tagged]
check("ps", len(loaded) == 1 and loaded[0].size_vram == 0 and loaded[0].expires_at is not None, running)

generated = client.generate(model=model, prompt="The sky is", system="Answer in one word.", options={"num_predict": 6}, stream=False)
# `context` (Ollama's token ids) is there, empty: clients that require it parse the answer.
check(
    "generate",
    generated.done and bool(generated.response) and generated.eval_count > 0 and generated.context == [],
    generated,
)

parts = list(client.generate(model=model, prompt="One, two,", raw=True, options={"num_predict": 6}, stream=True))
check("generate stream", parts[-1].done and "".join(p.response for p in parts) and parts[-1].eval_count > 0, parts)

schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
structured = client.chat(
    model=model,
    messages=[{"role": "user", "content": "Is the sky blue? Answer in JSON."}],
    format=schema,
    options={"num_predict": 40, "temperature": 0},
    stream=False,
)
try:
    parsed = json.loads(structured.message.content)
except ValueError as error:
    parsed = error
check("format schema", isinstance(parsed, dict) and isinstance(parsed.get("ok"), bool), structured)

embedded = client.embed(model=embed_model, input=["hello", "world"])
check(
    "embed",
    len(embedded.embeddings) == 2 and len(embedded.embeddings[0]) > 0 and embedded.embeddings[0] != embedded.embeddings[1],
    embedded,
)
single = client.embed(model=embed_model, input="hello")
check("embed string", len(single.embeddings) == 1 and single.embeddings[0] == embedded.embeddings[0], single)
older = client.embeddings(model=embed_model, prompt="hello")
check("embeddings", len(older.embedding) == len(single.embeddings[0]), older)

try:
    client.chat(model="no-such-model", messages=[{"role": "user", "content": "hi"}], stream=False)
    check("unknown model", False, "no error")
except ollama.ResponseError as error:
    check("unknown model", error.status_code == 404 and tagged in error.error, error)

try:
    client.pull("llama3")
    check("pull refused", False, "no error")
except ollama.ResponseError as error:
    check("pull refused", "arcane model add" in error.error, error)

try:
    client.chat(model=model, messages=[{"role": "user", "content": "hi"}], options={"num_ctx": 123457}, stream=False)
    check("num_ctx", False, "no error")
except ollama.ResponseError as error:
    check("num_ctx", error.status_code == 400 and "123457" in error.error, error)

# The context `show` reports is the one the model is served with (its `-c 2048`, not
# the file's 8192), and a client that sends it back as `num_ctx` (llama-index does),
# or less, is served.
served = shown.modelinfo["llama.context_length"]
answers = [
    client.chat(model=model, messages=[{"role": "user", "content": "hi"}], options={"num_ctx": n, "num_predict": 2})
    for n in (served, 256)
]
check("num_ctx served", served == 2048 and all(a.done for a in answers), (served, answers))

wrong = ollama.Client(host=root, headers={"Authorization": "Bearer wrong-token"}, timeout=30)
try:
    wrong.list()
    check("wrong token", False, "no error")
except ollama.ResponseError as error:
    # Ollama's shape (`error` a string), saying where the token is.
    said = error.error
    check("wrong token", error.status_code == 401 and isinstance(said, str) and "arcane token show" in said, said)
