#!/usr/bin/env bash
# The main job on a fresh machine: provision llama-server and SmolLM2 (cached),
# build Arcane, register both in the default workspace, and run `arcane serve` on
# the embedded default (llama.cpp + SmolLM2-135M on the CPU). Safe to run again:
# nothing is rebuilt, downloaded or registered twice.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1marcane:\033[0m %s\n' "$*" >&2; }

# Only what this job runs: llama-server and SmolLM2 (no npm, no test-only parts).
# Captured first so that a failed provisioning stops here (an `eval` of a failed
# command substitution would succeed with nothing set).
assignments="$(bash scripts/provision.sh main)"
eval "$(printf '%s\n' "$assignments" | grep -E '^(LLAMA_SERVER|ARCANE_TEST_MODEL)=')"

command -v cargo >/dev/null || { echo "arcane: error: cargo is missing; install Rust from https://rustup.rs and run again" >&2; exit 1; }
say "building arcane (release)"
cargo build --release --quiet --bin arcane
ARCANE="$PWD/target/release/arcane"

if ! "$ARCANE" runtime list --output json | grep -q '"id": *"llama.cpp"'; then
  say "registering llama-server as runtime \`llama.cpp\`"
  "$ARCANE" runtime add llama.cpp --executable "$LLAMA_SERVER" --backend cpu
fi
if ! "$ARCANE" model list --output json | grep -q '"id": *"smollm2-135m"'; then
  say "registering SmolLM2-135M as model \`smollm2-135m\`"
  "$ARCANE" model add smollm2-135m --file "$ARCANE_TEST_MODEL"
fi

say "starting the Core host on the embedded default (Ctrl-C stops it and its engine)"
exec "$ARCANE" serve "$@"
