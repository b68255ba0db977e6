"""One streamed answer through Arcane's front door, with the official client of
ARCANE_API (`openai`, `anthropic` or `ollama`), that the test cuts by killing the
engine once the first piece arrived.

Environment: ARCANE_ROOT_URL (the Core's URL, no /v1), ARCANE_TOKEN, ARCANE_MODEL,
ARCANE_API. Prints `first` (flushed) once the first piece arrived; then, when the
client raises, `error <exception class>: <message>` and exits 0; a stream that ends
without an error prints `complete` and exits 1 (the cut went unnoticed).
"""
import os
import sys

root, token, model, api = (
    os.environ[k] for k in ("ARCANE_ROOT_URL", "ARCANE_TOKEN", "ARCANE_MODEL", "ARCANE_API")
)
prompt = [{"role": "user", "content": "Tell a very long story about the sea."}]


def pieces():
    if api == "openai":
        import openai

        client = openai.OpenAI(base_url=root + "/v1", api_key=token, max_retries=0, timeout=120)
        stream = client.chat.completions.create(
            model=model, messages=prompt, max_tokens=4000, stream=True,
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            yield chunk
    elif api == "anthropic":
        import anthropic

        client = anthropic.Anthropic(base_url=root, auth_token=token, api_key=None, max_retries=0, timeout=120)
        with client.messages.stream(model=model, max_tokens=4000, messages=prompt) as stream:
            for text in stream.text_stream:
                yield text
    elif api == "ollama":
        import ollama

        client = ollama.Client(host=root, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        for part in client.chat(model=model, messages=prompt, stream=True, options={"num_predict": 4000}):
            yield part
    else:
        sys.exit(f"unknown ARCANE_API {api!r}")


first = True
try:
    for _ in pieces():
        if first:
            print("first", flush=True)
            first = False
except Exception as error:  # the client's own error type is what the test checks
    print(f"error {type(error).__name__}: {error}", flush=True)
    sys.exit(0)
print("complete", flush=True)
sys.exit(1)
