// The official `openai` npm client's audio API against Arcane's front door (the
// gateway of tests/clients/openai_audio.py). Environment: ARCANE_BASE_URL, ARCANE_TOKEN,
// ARCANE_SPEECH_WAV, ARCANE_OUT; NODE_PATH names the client's node_modules. Exits
// non-zero with a message on the first failure; prints one `ok <check>` per check.
const fs = require("fs");
const path = require("path");
const OpenAI = require("openai");
const { toFile } = require("openai");

const { ARCANE_BASE_URL: baseURL, ARCANE_TOKEN: apiKey } = process.env;
const JFK = "And so my fellow Americans ask not what your country can do for you, ask what you can do for your country.";
// Twenty words: Piper's voices draw noise at every run, so what comes back is compared
// by word error rate, as in openai_audio.py.
const SENTENCE = "The quick brown fox jumps over the lazy dog while the farmer watches from the porch near his old red barn.";
const split = (text) => text.toLowerCase().replace(/-/g, " ").replace(/[^a-z0-9 ]/g, "").split(/\s+/).filter(Boolean);
const words = (text) => split(text).join(" ");

function wordErrorRate(reference, heard) {
  const ref = split(reference), hyp = split(heard);
  let row = Array.from({ length: hyp.length + 1 }, (_, j) => j);
  ref.forEach((r, i) => {
    const next = [i + 1];
    hyp.forEach((h, j) => next.push(Math.min(row[j + 1] + 1, next[j] + 1, row[j] + (r === h ? 0 : 1))));
    row = next;
  });
  return row[hyp.length] / ref.length;
}

function check(name, condition, detail) {
  if (!condition) {
    console.error(`FAILED ${name}: ${JSON.stringify(detail)}`);
    process.exit(1);
  }
  console.log(`ok ${name}`);
}

async function main() {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 300000 });
  const wav = fs.readFileSync(process.env.ARCANE_SPEECH_WAV);
  const result = await client.audio.transcriptions.create({
    model: "whisper-1", file: await toFile(wav, "jfk.wav"),
  });
  check("npm transcriptions json", words(result.text) === words(JFK), result);
  const verbose = await client.audio.transcriptions.create({
    model: "whisper-1", file: fs.createReadStream(process.env.ARCANE_SPEECH_WAV), response_format: "verbose_json",
  });
  check("npm transcriptions verbose_json", verbose.language === "english" && verbose.segments.length > 0, verbose);

  const speech = await client.audio.speech.create({
    model: "tts-1", voice: "alloy", input: SENTENCE, response_format: "wav",
  });
  const audio = Buffer.from(await speech.arrayBuffer());
  check("npm speech wav", audio.subarray(0, 4).toString() === "RIFF" && audio.subarray(8, 12).toString() === "WAVE", audio.subarray(0, 16));
  const spoken = path.join(process.env.ARCANE_OUT, "npm.wav");
  fs.writeFileSync(spoken, audio);
  const heard = await client.audio.transcriptions.create({
    model: "whisper-1", file: fs.createReadStream(spoken), response_format: "text",
  });
  const rate = wordErrorRate(SENTENCE, heard);
  check("npm round trip", rate <= 0.1, { rate, heard });
}

main().catch((error) => {
  console.error(`FAILED ${error.stack || error}`);
  process.exit(1);
});
