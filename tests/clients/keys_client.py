"""An application key, used by the official `openai`, `anthropic` and `ollama` Python
clients as each sends its API key, against Arcane's front door.

Environment: ARCANE_ROOT_URL (the Core's URL, no /v1), ARCANE_APP_KEY (an `inference`
key made with `--models $ARCANE_MODEL`), ARCANE_MODEL, ARCANE_OTHER_MODEL (a model the
key may not use). Exits non-zero on the first failure; prints `ok <check>` per check.
"""
import json
import os
import sys
import urllib.error
import urllib.request

import anthropic
import ollama
import openai

root, key, model, other = (
    os.environ[k] for k in ("ARCANE_ROOT_URL", "ARCANE_APP_KEY", "ARCANE_MODEL", "ARCANE_OTHER_MODEL")
)


def check(name, condition, detail=""):
    if not condition:
        sys.exit(f"FAILED {name}: {detail}")
    print(f"ok {name}", flush=True)


def refused(call):
    """The exception `call` raises (None when it does not)."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the type is what is checked
        return error
    return None


hi = [{"role": "user", "content": "Say hi."}]

# OpenAI's client: `Authorization: Bearer KEY`.
oa = openai.OpenAI(base_url=f"{root}/v1", api_key=key, max_retries=0, timeout=120)
ids = [m.id for m in oa.models.list().data]
check("openai models.list shows only the key's models", ids == [model], ids)
reply = oa.chat.completions.create(model=model, messages=hi, max_tokens=4)
check("openai chat.completions", reply.choices[0].message.content is not None, reply)
error = refused(lambda: oa.chat.completions.create(model=other, messages=hi, max_tokens=4))
check(
    "openai another model is 403 naming the allowed ones",
    isinstance(error, openai.PermissionDeniedError)
    and error.body.get("code") == "CORE_MODEL_DENIED"
    and f"`{model}`" in error.body.get("message", ""),
    repr(error),
)
error = refused(lambda: oa.models.retrieve(other))
check("openai the other model is not found", isinstance(error, openai.NotFoundError), repr(error))

# Anthropic's client: `x-api-key: KEY`.
an = anthropic.Anthropic(base_url=root, api_key=key, max_retries=0, timeout=120)
message = an.messages.create(model=model, max_tokens=4, messages=hi)
check("anthropic messages.create with x-api-key", message.role == "assistant", message)
error = refused(lambda: an.messages.create(model=other, max_tokens=4, messages=hi))
check(
    "anthropic another model is a permission_error",
    isinstance(error, anthropic.PermissionDeniedError)
    and error.body.get("error", {}).get("type") == "permission_error",
    repr(error),
)

# Ollama's client: `Authorization: Bearer KEY` in its headers.
ol = ollama.Client(host=root, headers={"Authorization": f"Bearer {key}"}, timeout=120)
names = [m.model for m in ol.list().models]
check("ollama list shows only the key's models", names == [f"{model}:latest"], names)
chat = ol.chat(model=model, messages=hi, options={"num_predict": 4})
check("ollama chat", chat.message.role == "assistant", chat)
error = refused(lambda: ol.chat(model=other, messages=hi, options={"num_predict": 4}))
check(
    "ollama another model is 403",
    isinstance(error, ollama.ResponseError) and error.status_code == 403 and model in str(error),
    repr(error),
)


def raw(method, path, body=None):
    """Status and parsed body of one request with the key."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{root}{path}", data=data, method=method, headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


for method, path, body in [
    ("POST", "/v1/rpc", {"type": "request", "id": "1", "method": "models.list", "params": {}}),
    ("GET", "/v1/events", None),
    ("GET", "/v1/logs", None),
    ("GET", "/metrics", None),
    ("POST", "/props", {}),
    ("GET", "/slots", None),
]:
    status, text = raw(method, path, body)
    check(
        f"inference key refused {method} {path}",
        status == 403 and json.loads(text)["error"]["code"] == "CORE_SCOPE_DENIED",
        f"{status} {text}",
    )
status, text = raw("POST", "/api/pull", {"model": "x"})
check(
    "inference key refused /api/pull in Ollama's shape",
    status == 403 and isinstance(json.loads(text)["error"], str),
    f"{status} {text}",
)
