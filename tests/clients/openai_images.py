"""The official `openai` Python client's image API against Arcane's front door: one
gateway whose image model (`ARCANE_IMAGE_MODEL`) holds random weights, so what is
checked is what does not need trained ones: sizes, formats, seeds, counts, streaming
and refusals.

Environment: ARCANE_BASE_URL (ending in /v1), ARCANE_TOKEN, ARCANE_IMAGE_MODEL.
Exits non-zero with a message on the first failure; prints one `ok <check>` line per
check.
"""
import base64
import os
import struct
import sys

import openai

env = os.environ
client = openai.OpenAI(base_url=env["ARCANE_BASE_URL"], api_key=env["ARCANE_TOKEN"], max_retries=0, timeout=300)
MODEL = env["ARCANE_IMAGE_MODEL"]
# Arcane's extensions ride in the body: two steps keep a 64x64 image under a second.
FAST = {"steps": 2, "cfg_scale": 1.0}


def check(name, condition, detail=""):
    if not condition:
        sys.exit(f"FAILED {name}: {detail}")
    print(f"ok {name}", flush=True)


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return struct.unpack(">II", data[16:24])


def generate(seed, **options):
    options.setdefault("size", "64x64")
    return client.images.generate(model=MODEL, prompt="a lighthouse at dusk", response_format="b64_json",
                                  extra_body={**FAST, "seed": seed}, **options)


def images(result):
    return [base64.b64decode(d.b64_json) for d in result.data]


listed = [m.id for m in client.models.list()]
check("models.list has the image model", MODEL in listed, listed)

two = generate(7, n=2)
drawn = images(two)
check("n images", len(drawn) == 2, len(drawn))
check("png of the requested size", all(png_size(d) == (64, 64) for d in drawn), [png_size(d) for d in drawn])
check("the answer says the format and size", (two.output_format, two.size) == ("png", "64x64"), two)
check("the seeds are reported", [d.model_extra.get("seed") for d in two.data] == [7, 8], two.data)
again = images(generate(7))
check("the same seed draws the same bytes", again[0] == drawn[0])
other = images(generate(8))
check("image 2 of seed 7 is the image of seed 8", other[0] == drawn[1])
check("different seeds draw different images", drawn[0] != drawn[1])

wide = images(generate(3, size="128x64"))[0]
check("a wide size", png_size(wide) == (128, 64), png_size(wide))
jpeg = images(generate(3, output_format="jpeg"))[0]
check("jpeg", jpeg[:3] == b"\xff\xd8\xff", jpeg[:4])
webp = images(generate(3, output_format="webp"))[0]
check("webp", webp[:4] == b"RIFF" and webp[8:12] == b"WEBP", webp[:12])

for name, options, param in [
    ("a url response is refused", {"response_format": "url"}, "response_format"),
    ("a size that is no multiple of 64 is refused", {"size": "100x100"}, "size"),
    ("too many images are refused", {"n": 5}, "n"),
]:
    options = {"response_format": "b64_json", "size": "64x64", **options}
    try:
        client.images.generate(model=MODEL, prompt="x", extra_body=FAST, **options)
        check(name, False, "accepted")
    except openai.BadRequestError as error:
        body = error.body if isinstance(error.body, dict) else {}
        check(name, error.status_code == 400 and body.get("param") == param, (error.status_code, error.body))

# stream=True: Arcane's step events and OpenAI's completed event, read raw (the
# client's typed stream knows only OpenAI's event names).
with client.images.with_streaming_response.generate(
        model=MODEL, prompt="a lighthouse", size="64x64", response_format="b64_json",
        extra_body={"steps": 3, "cfg_scale": 1.0, "seed": 5, "stream": True}) as response:
    events = [line.split(":", 1)[1].strip() for line in response.iter_lines() if line.startswith("event:")]
check("a stream reports every step, then the image",
      events == ["image_generation.step"] * 3 + ["image_generation.completed"], events)
