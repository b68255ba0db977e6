"""The official clients against a model whose queue is full: Arcane's 503 carries
`Retry-After` (and `retry-after-ms`) computed from the work ahead, and each client backs
off as it does against the real service, then is served.

Usage: retry_client.py openai|anthropic|ollama|deadline. Environment: ARCANE_ROOT_URL,
ARCANE_TOKEN, ARCANE_MODEL (a model with `parallel = 1`, `max_queue = 0`),
ARCANE_QUEUED_MODEL (`parallel = 1`, a queue: for `deadline`), ARCANE_DEADLINE (for
`deadline`: a client timeout shorter than that model's measured service time) and
ARCANE_PATIENT (the timeout of every other request: far longer than any wait). This
machine's speed and load decide both, so the test passes them in. Prints `ready` and waits
for a line on standard input (the test fills the model's slot meanwhile); then prints
`ok <check>` per check and exits non-zero on the first failure. The slot stays taken
until the client prints `release` (the test then frees it at once) or `release when
queued` (the test frees it once a request waits in the queued model's queue).
"""
import logging
import os
import re
import sys

import httpx2

root, token, model, queued_model = (
    os.environ[k] for k in ("ARCANE_ROOT_URL", "ARCANE_TOKEN", "ARCANE_MODEL", "ARCANE_QUEUED_MODEL")
)
mode = sys.argv[1]
patient_timeout = float(os.environ["ARCANE_PATIENT"])
hi = [{"role": "user", "content": "Say hi."}]


def check(name, condition, detail=""):
    if not condition:
        sys.exit(f"FAILED {name}: {detail}")
    print(f"ok {name}", flush=True)


# Every answer the client got (status, Retry-After, retry-after-ms), and every delay it
# chose before a retry (from its own log line).
answers = []
delays = []


# Whether the next refusal has the test free the slot: the retries after it are served.
release_at_refusal = False


def record(response):
    global release_at_refusal
    answers.append(
        (response.status_code, response.headers.get("retry-after"), response.headers.get("retry-after-ms"))
    )
    if release_at_refusal and response.status_code == 503:
        release_at_refusal = False
        print("release", flush=True)


class Delays(logging.Handler):
    def emit(self, record):
        found = re.search(r"Retrying request.* in ([0-9.]+) seconds", record.getMessage())
        if found:
            delays.append(float(found.group(1)))


for name in ("openai", "anthropic"):
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.addHandler(Delays())
http = httpx2.Client(event_hooks={"response": [record]}, timeout=patient_timeout)

print("ready", flush=True)
sys.stdin.readline()


def backed_off_as_told(name):
    refusals = [a for a in answers if a[0] == 503]
    check(f"{name} was refused while the slot was taken", refusals, answers)
    told = [int(ms) / 1000 for _, _, ms in refusals]
    check(
        f"{name} waited what each refusal said before retrying",
        len(delays) == len(refusals) and all(abs(d - t) < 0.002 for d, t in zip(delays, told)),
        f"delays {delays}, told {told}",
    )
    check(
        f"{name} Retry-After is the same wait in whole seconds",
        all(int(secs) == max(1, -(-int(ms) // 1000)) for _, secs, ms in refusals),
        refusals,
    )
    check(f"{name} was served in the end", answers[-1][0] == 200, answers)


if mode == "openai":
    import openai

    client = openai.OpenAI(base_url=f"{root}/v1", api_key=token, http_client=http, max_retries=0)
    try:
        client.chat.completions.create(model=model, messages=hi, max_tokens=4)
        check("openai first try is refused", False, "it was served")
    except openai.InternalServerError as error:
        check(
            "openai first try is refused",
            error.status_code == 503 and error.body.get("code") == "CORE_OVERLOADED",
            repr(error.body),
        )
    answers.clear()
    release_at_refusal = True
    reply = client.with_options(max_retries=20).chat.completions.create(
        model=model, messages=hi, max_tokens=4
    )
    backed_off_as_told("openai")
elif mode == "anthropic":
    import anthropic

    client = anthropic.Anthropic(base_url=root, api_key=token, http_client=http, max_retries=0)
    try:
        client.messages.create(model=model, max_tokens=4, messages=hi)
        check("anthropic first try is overloaded", False, "it was served")
    except anthropic.APIStatusError as error:
        check(
            "anthropic first try is overloaded",
            error.status_code == 503 and error.body["error"]["type"] == "overloaded_error",
            repr(error.body),
        )
    answers.clear()
    release_at_refusal = True
    client.with_options(max_retries=20).messages.create(model=model, max_tokens=4, messages=hi)
    backed_off_as_told("anthropic")
elif mode == "ollama":
    import ollama

    client = ollama.Client(host=root, headers={"Authorization": f"Bearer {token}"}, timeout=patient_timeout)
    try:
        client.chat(model=model, messages=hi, options={"num_predict": 4})
        check("ollama is refused with 503", False, "it was served")
    except ollama.ResponseError as error:
        check(
            "ollama is refused with 503",
            error.status_code == 503 and "busy" in error.error,
            repr(error),
        )
elif mode == "deadline":
    import openai

    # A timeout shorter than the wait ahead: refused at once (503), not left to time out
    # in the queue (which would raise APITimeoutError instead).
    deadline = float(os.environ["ARCANE_DEADLINE"])
    client = openai.OpenAI(base_url=f"{root}/v1", api_key=token, max_retries=0, timeout=deadline)
    try:
        client.chat.completions.create(model=queued_model, messages=hi, max_tokens=4)
        check("a deadline shorter than the wait is refused at once", False, "it was served")
    except openai.InternalServerError as error:
        details = error.body.get("details", {})
        check(
            "a deadline shorter than the wait is refused at once",
            error.status_code == 503
            and details.get("reason") == "deadline"
            and abs(details.get("deadlineSeconds", 0) - deadline) < 0.001
            and details.get("expectedWaitSeconds", 0) > deadline,
            repr(error.body),
        )
    except openai.APITimeoutError as error:
        check("a deadline shorter than the wait is refused at once", False, "it timed out waiting")
    # A generous deadline waits its turn and is served.
    print("release when queued", flush=True)
    patient = openai.OpenAI(
        base_url=f"{root}/v1", api_key=token, max_retries=0, timeout=patient_timeout
    )
    reply = patient.chat.completions.create(model=queued_model, messages=hi, max_tokens=4)
    check("a deadline longer than the wait is served", reply.choices[0].message is not None, reply)
