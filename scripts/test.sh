#!/usr/bin/env bash
# Runs every test: provisions the real llama-server, the SmolLM2 model, the official
# client libraries, the ONNX parts and the speech models (cached, see
# scripts/provision.sh), then the lint gate and the whole workspace's unit, integration
# and multi-process tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Everything the tests drive (`all`: also the client libraries, which need npm, the
# ONNX parts, the speech models and the image parts). Captured first so that a failed provisioning stops here.
assignments="$(bash scripts/provision.sh all)"
eval "$(printf '%s\n' "$assignments" | grep -E '^(LLAMA_SERVER|ARCANE_TEST_MODEL|ARCANE_CLIENTS_PYTHON|ARCANE_NODE_CLIENTS|ARCANE_FRAMEWORKS_PYTHON|ARCANE_NODE_FRAMEWORKS|ARCANE_ONNXRUNTIME|ARCANE_ONNX_PYTHON|ARCANE_SILERO_VAD|ARCANE_SPEECH_WAV|ARCANE_CHROMIUM|ARCANE_BROWSER_PYTHON|ARCANE_WHISPER_MODEL|ARCANE_WHISPER_CLI|ARCANE_WHISPER_VAD|ARCANE_PIPER_VOICE|ARCANE_ESPEAK|ARCANE_SPEECH_FLAC|ARCANE_SPEECH_MP3|ARCANE_SPEECH_OGG|ARCANE_SOUNDFILE_PYTHON|ARCANE_SD_LIBRARY|ARCANE_SD_CLI|ARCANE_SD_MODEL)=')"
export LLAMA_SERVER ARCANE_TEST_MODEL ARCANE_CLIENTS_PYTHON ARCANE_NODE_CLIENTS ARCANE_FRAMEWORKS_PYTHON ARCANE_NODE_FRAMEWORKS ARCANE_ONNXRUNTIME ARCANE_ONNX_PYTHON ARCANE_SILERO_VAD ARCANE_SPEECH_WAV ARCANE_CHROMIUM ARCANE_BROWSER_PYTHON \
  ARCANE_WHISPER_MODEL ARCANE_WHISPER_CLI ARCANE_WHISPER_VAD ARCANE_PIPER_VOICE ARCANE_ESPEAK \
  ARCANE_SPEECH_FLAC ARCANE_SPEECH_MP3 ARCANE_SPEECH_OGG ARCANE_SOUNDFILE_PYTHON ARCANE_SD_LIBRARY ARCANE_SD_CLI ARCANE_SD_MODEL

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# Each failing test's output comes once more at the very end: libtest prints it in the
# middle of a long run, where a log cut down to its head and tail loses it.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
if [ "$status" -ne 0 ]; then
  echo
  echo "==== the failing tests' output again (backtraces left out; the last 40 lines of each) ===="
  awk -f scripts/failures.awk "$log"
fi
exit "$status"
