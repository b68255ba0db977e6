"""The official `openai` Python client against Arcane's front door.

Environment: ARCANE_BASE_URL (the Core's OpenAI base URL, ending in /v1), ARCANE_TOKEN,
ARCANE_MODEL (the served model id), and ARCANE_EMBED_BASE_URL / ARCANE_EMBED_MODEL /
ARCANE_EMBED_TOKEN for an engine started with `--embeddings` (behind its own Core). Exits non-zero with a message on the first
failure; prints one `ok <check>` line per check.
"""
import os
import sys

import openai

base, token, model = (os.environ[k] for k in ("ARCANE_BASE_URL", "ARCANE_TOKEN", "ARCANE_MODEL"))
client = openai.OpenAI(base_url=base, api_key=token, max_retries=0, timeout=120)


def check(name, condition, detail=""):
    if not condition:
        sys.exit(f"FAILED {name}: {detail}")
    print(f"ok {name}", flush=True)


listed = [m.id for m in client.models.list()]
check("models.list", model in listed, listed)
retrieved = client.models.retrieve(model)
check("models.retrieve", retrieved.id == model, retrieved)
try:
    client.models.retrieve("no-such-model")
    check("models.retrieve unknown", False, "no error")
except openai.NotFoundError as error:
    check("models.retrieve unknown", error.status_code == 404, error)

chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
)
check("chat.completions", bool(chat.choices[0].message.content), chat)

pieces = []
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Count to five."}], max_tokens=16, stream=True
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
check("chat.completions stream", len(pieces) >= 2 and "".join(pieces), pieces)

completion = client.completions.create(model=model, prompt="The sky is", max_tokens=6)
check("completions", bool(completion.choices[0].text), completion)

response = client.responses.create(model=model, input="Say hi.", max_output_tokens=8)
check("responses.create", bool(response.output_text), response)

events = [e.type for e in client.responses.create(model=model, input="Say hi.", max_output_tokens=8, stream=True)]
check("responses.create stream", "response.completed" in events, events)

try:
    openai.OpenAI(base_url=base, api_key="wrong-token-0123456789", max_retries=0).models.list()
    check("wrong token", False, "no error")
except openai.AuthenticationError as error:
    check("wrong token", error.status_code == 401, error)

embed_base = os.environ.get("ARCANE_EMBED_BASE_URL")
if embed_base:
    embed_token = os.environ.get("ARCANE_EMBED_TOKEN", token)
    embedder = openai.OpenAI(base_url=embed_base, api_key=embed_token, max_retries=0, timeout=120)
    result = embedder.embeddings.create(model=os.environ["ARCANE_EMBED_MODEL"], input=["red apple", "green pear"])
    vectors = [d.embedding for d in result.data]
    check("embeddings.create", len(vectors) == 2 and len(vectors[0]) > 16 and vectors[0] != vectors[1], len(vectors))
