#!/usr/bin/env bash
# Runs every test: provisions the real llama-server, the SmolLM2 model and the official
# client libraries (cached, see scripts/provision.sh), then the whole workspace's unit, integration and
# multi-process tests, then the lint gate.
set -euo pipefail
cd "$(dirname "$0")/.."

eval "$(bash scripts/provision.sh | grep -E '^(LLAMA_SERVER|ARCANE_TEST_MODEL|ARCANE_CLIENTS_PYTHON|ARCANE_NODE_CLIENTS|ARCANE_ONNXRUNTIME|ARCANE_ONNX_PYTHON|ARCANE_SILERO_VAD|ARCANE_SPEECH_WAV)=')"
export LLAMA_SERVER ARCANE_TEST_MODEL ARCANE_CLIENTS_PYTHON ARCANE_NODE_CLIENTS ARCANE_ONNXRUNTIME ARCANE_ONNX_PYTHON ARCANE_SILERO_VAD ARCANE_SPEECH_WAV

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace --no-fail-fast "$@"
