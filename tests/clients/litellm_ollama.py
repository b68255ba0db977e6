"""litellm's `ollama_chat/` provider against Arcane's front door (Ollama's API).

Environment: ARCANE_ROOT_URL, ARCANE_TOKEN, ARCANE_MODEL. Prints one `ok <check>` per
check; exits non-zero on the first failure.
"""
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm  # noqa: E402

root, token, model = (os.environ[k] for k in ("ARCANE_ROOT_URL", "ARCANE_TOKEN", "ARCANE_MODEL"))
headers = {"Authorization": f"Bearer {token}"}


def check(name, condition, detail=""):
    if not condition:
        sys.exit(f"FAILED {name}: {detail}")
    print(f"ok {name}", flush=True)


reply = litellm.completion(
    model=f"ollama_chat/{model}",
    messages=[{"role": "user", "content": "Say hi."}],
    api_base=root,
    extra_headers=headers,
    max_tokens=8,
)
check("ollama_chat", bool(reply.choices[0].message.content) and reply.usage.completion_tokens > 0, reply)

pieces = []
for chunk in litellm.completion(
    model=f"ollama_chat/{model}",
    messages=[{"role": "user", "content": "Count to five."}],
    api_base=root,
    extra_headers=headers,
    max_tokens=12,
    stream=True,
):
    pieces.append(chunk.choices[0].delta.content or "")
check("ollama_chat stream", len(pieces) > 2 and "".join(pieces), pieces)
