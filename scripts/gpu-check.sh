#!/usr/bin/env bash
# GPU check for `arcane-devices`, for a machine with an NVIDIA GPU and driver.
#
# 1. builds `arcane` (or uses $ARCANE_BIN, e.g. a binary carried to a machine without
#    cargo), prints the real catalog;
# 2. checks the first NVIDIA device against `nvidia-smi` (same UUID);
# 3. resolves it with a CUDA runtime and checks the plan pins exactly that UUID;
# 4. checks that an unknown id and a CPU-only runtime are refused (exit 1), and runs
#    `cargo test -p arcane-devices` against the real driver (when building with cargo);
# 5. when $LLAMA_SERVER_CUDA (a CUDA build of llama-server) and $ARCANE_TEST_MODEL
#    (a GGUF) are set: starts the server with the plan's args and environment on
#    127.0.0.1, waits for /health, and runs `arcane devices check-placement`.
#
# Writes everything under $OUT (default: a temporary directory). Exit 0 = all checks
# passed; a placement the driver cannot observe (pid namespaces) is a warning only.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

if [[ -n "${ARCANE_BIN:-}" ]]; then
  arcane="$ARCANE_BIN"
elif command -v cargo >/dev/null; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/gpu-check}"
  timeout 480 cargo build -q -p arcane >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "FAIL: cargo build" >&2; exit 1; }
  arcane="$CARGO_TARGET_DIR/debug/arcane"
else
  echo "FAIL: no cargo and no \$ARCANE_BIN" >&2; exit 1
fi
ws="$OUT/workspace"; mkdir -p "$ws"
a() { "$arcane" --workspace "$ws" "$@"; }
json_get() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

if command -v nvidia-smi >/dev/null; then nvidia-smi -L | tee "$OUT/nvidia-smi-L.txt"; else echo "(no nvidia-smi)"; fi

# 1. The real catalog.
a devices | tee "$OUT/catalog.txt"
a devices --output json >"$OUT/catalog.json" || fail "arcane devices --output json"
state=$(json_get "$OUT/catalog.json" 'd["state"]')
id=$(json_get "$OUT/catalog.json" 'next((x["deviceId"] for x in d["devices"] if x["vendor"]=="nvidia" and x["deviceId"]), "")')
uuid=$(json_get "$OUT/catalog.json" 'next((x["addresses"]["uuid"] for x in d["devices"] if x["deviceId"]=="'"$id"'"), "")')
echo "state=$state first NVIDIA deviceId=$id uuid=$uuid"
[[ -n "$id" ]] || { fail "no NVIDIA GPU in the catalog"; exit 1; }

# 2. Same UUID as the driver's own tool.
if smi_uuids=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null); then
  grep -qx "$uuid" <<<"$smi_uuids" && pass "catalog UUID $uuid is listed by nvidia-smi" || fail "UUID $uuid not in nvidia-smi: $smi_uuids"
  [[ "$id" == "nvidia-$(tr 'A-Z' 'a-z' <<<"$uuid")" ]] && pass "deviceId derives from the UUID" || fail "deviceId $id does not derive from $uuid"
fi

# 3. Resolution.
a devices resolve "$id" --runtime-backend cuda | tee "$OUT/plan.txt"
a devices resolve "$id" --runtime-backend cuda --output json >"$OUT/plan.json" || fail "resolve $id"
[[ "$(json_get "$OUT/plan.json" 'd["env"]["CUDA_VISIBLE_DEVICES"]')" == "$uuid" ]] && pass "plan pins CUDA_VISIBLE_DEVICES=$uuid" || fail "plan does not pin $uuid"
[[ "$(json_get "$OUT/plan.json" '" ".join(d["args"])')" == "--device CUDA0 --split-mode none --main-gpu 0 --gpu-layers all" ]] && pass "plan args" || fail "plan args"

# 4. Refusals.
a devices resolve nvidia-gpu-00000000-0000-0000-0000-000000000000 --runtime-backend cuda >/dev/null 2>&1; rc=$?
[[ $rc -eq 1 ]] && pass "unknown id refused" || fail "unknown id: exit $rc"
a devices resolve "$id" --runtime-backend cpu >/dev/null 2>&1; rc=$?
[[ $rc -eq 1 ]] && pass "CPU-only runtime refused" || fail "CPU-only runtime: exit $rc"

# The library's own tests against the real driver (the probe lists NVML GPUs; the
# placement check of a process without a GPU context changes nothing).
if [[ -z "${ARCANE_BIN:-}" ]]; then
  timeout 300 cargo test -q -p arcane-devices --test it >"$OUT/cargo-test.log" 2>&1 && pass "cargo test -p arcane-devices" || { tail -30 "$OUT/cargo-test.log"; fail "cargo test -p arcane-devices"; }
fi

# 5. A real CUDA engine on the plan, then the placement check.
if [[ -n "${LLAMA_SERVER_CUDA:-}" && -n "${ARCANE_TEST_MODEL:-}" ]]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mapfile -t args < <(json_get "$OUT/plan.json" '"\n".join(d["args"])')
  env_args=(); while IFS= read -r kv; do env_args+=("$kv"); done < <(json_get "$OUT/plan.json" '"\n".join(k+"="+v for k,v in d["env"].items())')
  unset_args=(); while IFS= read -r name; do [[ -n "$name" ]] && unset_args+=(-u "$name"); done < <(json_get "$OUT/plan.json" '"\n".join(d["envRemove"])')
  env "${unset_args[@]}" "${env_args[@]}" "$LLAMA_SERVER_CUDA" --host 127.0.0.1 --port "$port" -m "$ARCANE_TEST_MODEL" "${args[@]}" >"$OUT/llama-server.log" 2>&1 &
  server=$!
  trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.5
  done
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
    pass "llama-server ready on the plan (pid $server)"
    grep -iE "CUDA0|found [0-9]+ CUDA devices|offloaded" "$OUT/llama-server.log" | head -5
    nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>/dev/null | tee "$OUT/compute-apps.txt"
    a devices check-placement "$id" --runtime-backend cuda --pid "$server" --output json | tee "$OUT/placement.json"; rc=${PIPESTATUS[0]}
    if [[ $rc -ne 0 ]]; then fail "placement check exit $rc"
    else
      placement=$(json_get "$OUT/placement.json" 'd["placement"]')
      case "$placement" in
        confirmed) pass "placement confirmed on $uuid" ;;
        not-observed) echo "WARN: placement not observed (pid namespace?): $(json_get "$OUT/placement.json" 'd["reason"]')" ;;
        *) fail "placement: $placement" ;;
      esac
    fi
  else
    fail "llama-server did not become ready"; tail -30 "$OUT/llama-server.log"
  fi
else
  echo "skip: set LLAMA_SERVER_CUDA and ARCANE_TEST_MODEL to start a CUDA engine on the plan"
fi

echo "results in $OUT; failures: $failures"
[[ $failures -eq 0 ]]
