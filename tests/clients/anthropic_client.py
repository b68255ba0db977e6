"""The official `anthropic` Python client against Arcane's front door
(llama.cpp's `/v1/messages`).

Environment: ARCANE_ROOT_URL (the Core's URL, no /v1), ARCANE_TOKEN, ARCANE_MODEL.
Exits non-zero with a message on the first failure; prints `ok <check>` per check.
"""
import os
import sys

import anthropic

root, token, model = (os.environ[k] for k in ("ARCANE_ROOT_URL", "ARCANE_TOKEN", "ARCANE_MODEL"))
# `auth_token` sends `Authorization: Bearer`; `api_key` (the client's usual setting, and
# litellm's `anthropic/`) sends `x-api-key`. Arcane admits either.
client = anthropic.Anthropic(base_url=root, auth_token=token, api_key=None, max_retries=0, timeout=120)
keyed = anthropic.Anthropic(base_url=root, api_key=token, max_retries=0, timeout=120)


def check(name, condition, detail=""):
    if not condition:
        sys.exit(f"FAILED {name}: {detail}")
    print(f"ok {name}", flush=True)


message = client.messages.create(
    model=model, max_tokens=8, messages=[{"role": "user", "content": "Say hi."}]
)
text = "".join(block.text for block in message.content if block.type == "text")
check("messages.create", message.role == "assistant" and text, message)

with client.messages.stream(
    model=model, max_tokens=16, messages=[{"role": "user", "content": "Count to five."}]
) as stream:
    deltas = [t for t in stream.text_stream]
    final = stream.get_final_message()
check("messages.create stream", len(deltas) >= 2 and final.stop_reason is not None, deltas)

counted = client.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Say hi."}])
check("messages.count_tokens", counted.input_tokens > 0, counted)

message = keyed.messages.create(
    model=model, max_tokens=8, messages=[{"role": "user", "content": "Say hi."}]
)
check("messages.create with api_key (x-api-key)", message.role == "assistant", message)

wrong = anthropic.Anthropic(base_url=root, api_key="not-the-token", max_retries=0, timeout=120)
try:
    wrong.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Hi"}])
    check("a wrong api_key is refused", False, "it was admitted")
except anthropic.AuthenticationError:
    check("a wrong api_key is refused", True)
