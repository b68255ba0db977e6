"""The official `openai` Python client's audio API against Arcane's front door: one
gateway with a chat model, a whisper.cpp model (`whisper-1`) and a Piper voice
(`tts-1`).

Environment: ARCANE_BASE_URL (ending in /v1), ARCANE_TOKEN, ARCANE_CHAT_MODEL, and the
clip `jfk.wav` with its encodings: ARCANE_SPEECH_WAV, ARCANE_SPEECH_FLAC,
ARCANE_SPEECH_MP3; ARCANE_NOT_AUDIO (a file that is no audio); ARCANE_OUT (a directory
to write the spoken audio to); ARCANE_SOUNDFILE_PYTHON (a Python with `soundfile`:
the voice's MP3 and Ogg Opus are decoded by libsndfile, not by Arcane). Exits non-zero with a message on the first failure;
prints one `ok <check>` line per check.
"""
import base64
import json
import os
import re
import subprocess
import sys
import wave

import openai

env = os.environ
client = openai.OpenAI(base_url=env["ARCANE_BASE_URL"], api_key=env["ARCANE_TOKEN"], max_retries=0, timeout=300)
JFK = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."
# Twenty words, spoken by the voice and heard by the whisper model.
SENTENCE = "The quick brown fox jumps over the lazy dog while the farmer watches from the porch near his old red barn."
# Five sentences (no commas: a comma also ends a piece of speech).
FIVE = ("The sun rose over the quiet valley. A farmer walked out to his old red barn. "
        "His dog ran ahead through the tall grass. Birds sang in the trees along the river. "
        "It was going to be a warm and busy day.")
DECODE = ("import json, sys, soundfile\n"
          "data, rate = soundfile.read(sys.argv[1])\n"
          "soundfile.write(sys.argv[2], data, rate, subtype='PCM_16')\n"
          "print(json.dumps([rate, len(data) / rate]))\n")


def check(name, condition, detail=""):
    if not condition:
        sys.exit(f"FAILED {name}: {detail}")
    print(f"ok {name}", flush=True)


def words(text):
    return re.sub(r"[^a-z0-9 ]", "", text.lower().replace("-", " ")).split()


def word_error_rate(reference, heard):
    ref, hyp = words(reference), words(heard)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[len(hyp)] / len(ref)


def decoded(content, name):
    """Writes `content` to ARCANE_OUT/name and decodes it with libsndfile into a WAV
    beside it: (that WAV's path, its rate, its seconds)."""
    source = os.path.join(env["ARCANE_OUT"], name)
    with open(source, "wb") as out:
        out.write(content)
    wav = source + ".wav"
    run = subprocess.run([env["ARCANE_SOUNDFILE_PYTHON"], "-c", DECODE, source, wav],
                         capture_output=True, text=True, timeout=120)
    check(f"libsndfile decodes {name}", run.returncode == 0, run.stderr)
    rate, seconds = json.loads(run.stdout)
    return wav, rate, seconds


def pcm_as_wav(pcm, name, rate=22050):
    path = os.path.join(env["ARCANE_OUT"], name)
    with wave.open(path, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm)
    return path


def heard_back(path, reference, name, limit=0.10):
    heard = transcribe(path).text
    rate = word_error_rate(reference, heard)
    print(json.dumps({"check": name, "spoken": reference, "heard": heard, "wer": rate}), flush=True)
    check(name, rate <= limit, f"{rate:.2%}: {heard!r}")


def transcribe(path, **options):
    with open(path, "rb") as audio:
        return client.audio.transcriptions.create(model="whisper-1", file=audio, **options)


listed = [m.id for m in client.models.list()]
check("models.list has the chat, speech and voice models",
      {env["ARCANE_CHAT_MODEL"], "whisper-1", "tts-1"} <= set(listed), listed)

result = transcribe(env["ARCANE_SPEECH_WAV"])
check("transcriptions json", words(result.text) == words(JFK), result)
check("transcriptions json is one line", "\n" not in result.text, repr(result.text))

text = transcribe(env["ARCANE_SPEECH_WAV"], response_format="text")
check("transcriptions text", words(text) == words(JFK), text)

srt = transcribe(env["ARCANE_SPEECH_WAV"], response_format="srt")
cues = re.findall(r"(\d+)\n(\d\d:\d\d:\d\d,\d\d\d) --> (\d\d:\d\d:\d\d,\d\d\d)\n(.+)\n", srt)
check("transcriptions srt", cues and cues[0][0] == "1" and words(" ".join(c[3] for c in cues)) == words(JFK), srt)

vtt = transcribe(env["ARCANE_SPEECH_WAV"], response_format="vtt")
check("transcriptions vtt", vtt.startswith("WEBVTT\n") and re.search(r"\d\d:\d\d:\d\d\.\d\d\d --> ", vtt), vtt)

verbose = transcribe(env["ARCANE_SPEECH_WAV"], response_format="verbose_json",
                     timestamp_granularities=["segment"])
segments = verbose.segments or []
check("transcriptions verbose_json",
      verbose.language == "english" and abs(verbose.duration - 11.0) < 0.2 and segments
      and all(s.end >= s.start for s in segments) and segments[-1].end <= 11.1
      and words(" ".join(s.text for s in segments)) == words(JFK), verbose)

timed = transcribe(env["ARCANE_SPEECH_WAV"], response_format="verbose_json",
                   timestamp_granularities=["word", "segment"])
timed_words = timed.words or []
check("transcriptions word timestamps",
      words(" ".join(w.word for w in timed_words)) == words(JFK)
      and all(a.start <= b.start for a, b in zip(timed_words, timed_words[1:]))
      and all(w.start <= w.end <= 11.1 for w in timed_words) and timed.segments, timed)

# Streamed: OpenAI's transcript.text.delta events as segments are decoded, then done.
events = list(transcribe(env["ARCANE_SPEECH_WAV"], stream=True))
types = [event.type for event in events]
deltas = [event.delta for event in events if event.type == "transcript.text.delta"]
done = events[-1] if events else None
check("transcriptions stream deltas, then done",
      done is not None and done.type == "transcript.text.done" and deltas
      and types[:-1] == ["transcript.text.delta"] * len(deltas)
      and "".join(deltas) == done.text and words(done.text) == words(JFK)
      and done.usage.seconds == 11, [e.to_dict() for e in events])

try:
    list(transcribe(env["ARCANE_SPEECH_WAV"], stream=True, response_format="srt"))
    check("a streamed srt is refused", False, "no error")
except openai.BadRequestError as error:
    body = error.body if isinstance(error.body, dict) else {}
    check("a streamed srt is refused", body.get("param") == "stream" and "srt" in str(error), error)

for var, name in (("ARCANE_SPEECH_FLAC", "flac"), ("ARCANE_SPEECH_MP3", "mp3")):
    result = transcribe(env[var])
    check(f"transcriptions {name}", words(result.text) == words(JFK), result)

try:
    transcribe(env["ARCANE_NOT_AUDIO"])
    check("a file that is no audio is refused", False, "no error")
except openai.BadRequestError as error:
    body = error.body if isinstance(error.body, dict) else {}
    check("a file that is no audio is refused",
          error.status_code == 400 and body.get("code") == "AUDIO_UNSUPPORTED", error)

try:
    transcribe(env["ARCANE_SPEECH_WAV"], response_format="mp3")
    check("an unknown response_format is refused", False, "no error")
except openai.BadRequestError as error:
    check("an unknown response_format is refused", "mp3" in str(error), error)

try:
    with open(env["ARCANE_SPEECH_WAV"], "rb") as audio:
        client.audio.translations.create(model="whisper-1", file=audio)
    check("an English-only model does not translate", False, "no error")
except openai.BadRequestError as error:
    check("an English-only model does not translate", "English only" in str(error), error)

speech = client.audio.speech.create(model="tts-1", voice="alloy", input=SENTENCE, response_format="wav")
spoken = os.path.join(env["ARCANE_OUT"], "sentence.wav")
speech.write_to_file(spoken)
with wave.open(spoken) as played:
    rate, channels, width, frames = played.getframerate(), played.getnchannels(), played.getsampwidth(), played.getnframes()
check("speech wav is playable", (rate, channels, width) == (22050, 1, 2) and 2 * rate < frames < 20 * rate,
      (rate, channels, width, frames))

heard = transcribe(spoken).text
rate = word_error_rate(SENTENCE, heard)
print(json.dumps({"spoken": SENTENCE, "heard": heard, "wer": rate}), flush=True)
check("round trip word error rate <= 10%", rate <= 0.10, f"{rate:.2%}: {heard!r}")

flac = client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.", response_format="flac")
check("speech flac", flac.content[:4] == b"fLaC", flac.content[:16])

# OpenAI's default response_format is mp3: what a client that names none gets.
mp3 = client.audio.speech.create(model="tts-1", voice="alloy", input=SENTENCE)
check("speech is mp3 by default", mp3.response.headers.get("content-type") == "audio/mpeg"
      and mp3.content[0] == 0xFF and mp3.content[1] & 0xE0 == 0xE0, mp3.content[:16])
wav, rate, seconds = decoded(mp3.content, "sentence.mp3")
check("speech mp3 decodes at the voice's rate", rate == 22050 and 2 < seconds < 20, (rate, seconds))
heard_back(wav, SENTENCE, "speech mp3 is heard back")

opus = client.audio.speech.create(model="tts-1", voice="alloy", input=SENTENCE, response_format="opus")
check("speech opus is Ogg Opus", opus.content[:4] == b"OggS" and b"OpusHead" in opus.content[:64]
      and opus.response.headers.get("content-type", "").startswith("audio/ogg"), opus.content[:64])
wav, rate, seconds = decoded(opus.content, "sentence.opus")
# libsndfile decodes at the Opus rate nearest the voice's own (OpusHead names 22050 Hz).
check("speech opus decodes", rate in (24000, 48000) and 2 < seconds < 20, (rate, seconds))
heard_back(wav, SENTENCE, "speech opus is heard back")

try:
    client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.", response_format="aac")
    check("speech aac is refused naming the formats", False, "no error")
except openai.BadRequestError as error:
    body = error.body if isinstance(error.body, dict) else {}
    check("speech aac is refused naming the formats", error.status_code == 400
          and body.get("param") == "response_format" and "mp3, opus, wav, flac, pcm" in str(error), error)

# Streamed audio: chunked as each sentence is made, no length up front.
with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=FIVE, response_format="pcm", stream_format="audio") as streamed:
    headers = streamed.headers
    pcm = b"".join(streamed.iter_bytes())
check("speech streams chunked", "content-length" not in headers
      and headers.get("transfer-encoding") == "chunked" and headers.get("x-sample-rate") == "22050",
      dict(headers))
heard_back(pcm_as_wav(pcm, "five.wav"), FIVE, "streamed speech is heard back", limit=0.15)

# OpenAI's server-sent events: one delta per sentence, then done.
with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=FIVE, response_format="pcm", stream_format="sse") as streamed:
    content_type = streamed.headers.get("content-type")
    events = [json.loads(line[len("data: "):]) for line in streamed.iter_lines() if line.startswith("data: ")]
deltas = [e for e in events if e.get("type") == "speech.audio.delta"]
check("speech sse sends a delta per sentence, then done",
      content_type == "text/event-stream" and len(deltas) == 5 and events[-1].get("type") == "speech.audio.done"
      and events[-1]["usage"]["input_tokens"] > 0, [e.get("type") for e in events])
pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
heard_back(pcm_as_wav(pcm, "five-sse.wav"), FIVE, "speech sse is heard back", limit=0.15)

chat = client.chat.completions.create(model=env["ARCANE_CHAT_MODEL"], max_tokens=8,
                                      messages=[{"role": "user", "content": "Say hi."}])
check("chat beside speech", bool(chat.choices[0].message.content), chat)
