#!/usr/bin/env bash
# Runs every test: provisions the real llama-server, the SmolLM2 model, the official
# client libraries and the ONNX parts (cached, see scripts/provision.sh), then the lint
# gate and the whole workspace's unit, integration and multi-process tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Everything the tests drive (`all`: also the client libraries, which need npm, and the
# ONNX parts). Captured first so that a failed provisioning stops here.
assignments="$(bash scripts/provision.sh all)"
eval "$(printf '%s\n' "$assignments" | grep -E '^(LLAMA_SERVER|ARCANE_TEST_MODEL|ARCANE_CLIENTS_PYTHON|ARCANE_NODE_CLIENTS|ARCANE_ONNXRUNTIME|ARCANE_ONNX_PYTHON|ARCANE_SILERO_VAD|ARCANE_SPEECH_WAV|ARCANE_CHROMIUM|ARCANE_BROWSER_PYTHON)=')"
export LLAMA_SERVER ARCANE_TEST_MODEL ARCANE_CLIENTS_PYTHON ARCANE_NODE_CLIENTS ARCANE_ONNXRUNTIME ARCANE_ONNX_PYTHON ARCANE_SILERO_VAD ARCANE_SPEECH_WAV ARCANE_CHROMIUM ARCANE_BROWSER_PYTHON

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace --no-fail-fast "$@"
