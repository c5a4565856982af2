# What the benchmark scripts share: their arguments, the programs they need,
# the engine's device as a node config says it, the probe's expected answer
# recorded from a plain engine, and the part of a node config every
# benchmark node has. Sourced, not run:
#
#   . "$(dirname "$0")/lib.sh"
#   bench_args "usage: bench/x.sh OUTDIR [BIN_DIR]" "$@"   # sets here repo out bin doc
#   bench_need wsup wsup-engine                            # fails naming what to build
#   bench_device "$device"                                 # sets backend devices_line
#   expect=$(bench_record_expect "$model" "$device" "$out/record.log")
#   bench_node_config "$cfg" "$node" NAME "$model" "$kv_args" READY_TIMEOUT_MS
#   cat >> "$cfg" <<EOF ... the script's own [probe], [front], ... EOF
#
# Every benchmark writes into the OUTDIR it is given and nowhere else (DOC,
# when a script updates docs/benchmarks.md, is the one exception it names).

# bench_args USAGE OUTDIR [BIN_DIR]: `out` is OUTDIR, made and absolute;
# `bin` is BIN_DIR (default build/bin in the repository), absolute; `here`
# is bench/, `repo` the repository; `doc` is $DOC or docs/benchmarks.md.
bench_args() {
  local usage=$1
  shift
  if [ $# -lt 1 ] || [ -z "$1" ]; then
    echo "$usage" >&2
    exit 2
  fi
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # bench/, where this file is
  repo=$(cd "$here/.." && pwd)
  mkdir -p "$1"
  out=$(cd "$1" && pwd)
  local b=${2:-$repo/build/bin}
  if [ ! -d "$b" ]; then
    echo "${usage%% *}: no folder $b for the programs; build them (scripts/release_build.sh) or pass BIN_DIR" >&2
    exit 2
  fi
  bin=$(cd "$b" && pwd)
  doc=${DOC:-$repo/docs/benchmarks.md}
}

# bench_need PROGRAM...: each must be an executable in $bin.
bench_need() {
  local p
  for p in "$@"; do
    if [ ! -x "$bin/$p" ]; then
      echo "$(basename "$0"): $bin/$p is missing; build it (ninja -C <build dir> $p)" >&2
      exit 1
    fi
  done
}

# bench_device DEVICE (cpu, cuda:N or cuda:N,M): `backend` for [weight_cache]
# and `devices_line`, the [parallel] section's body.
bench_device() {
  local device=$1
  if [ "$device" = cpu ]; then
    backend=host
    devices_line="tp = 1"
  else
    backend=cuda
    local dev=${device#cuda:}
    local tp
    tp=$(echo "$dev" | tr ',' '\n' | wc -l)
    devices_line="tp = $tp
devices = [$dev]"
  fi
}

# bench_record_expect MODEL DEVICE LOG: prints the probe's expected answer,
# the token ids of 8 greedy tokens for "Hello, world" from a plain engine on
# MODEL (its log in LOG), as a JSON array; the engine is stopped after.
bench_record_expect() {
  local model=$1 device=$2 log=$3
  "$bin/wsup-engine" --model "$model" --port 0 --device "$device" --weight-cache off --kv-cache-mib 256 \
    > "$log" 2>&1 &
  local rec=$! status=0
  python3 - "$log" <<'PY' || status=$?
import json, re, sys, time, urllib.request
port = None
for _ in range(6000):  # ten minutes: a large model loads from disk first
    m = re.search(r"listening on [0-9.]+:(\d+)", open(sys.argv[1]).read())
    if m:
        try:
            s = json.load(urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/wsup/status", timeout=2))
            if s.get("state") == "ready":
                port = m.group(1)
                break
        except Exception:
            pass
    time.sleep(0.1)
if port is None:
    sys.exit(f"the engine recording the probe's answer did not get ready in ten minutes; see {sys.argv[1]}")
body = json.dumps({"prompt": "Hello, world", "max_tokens": 8, "temperature": 0, "return_token_ids": True}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                             headers={"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["token_ids"])
PY
  kill "$rec" 2>/dev/null || true
  wait "$rec" 2>/dev/null || true
  return "$status"
}

# bench_node_config FILE NODE_DIR NAME MODEL KV_ARGS READY_TIMEOUT_MS: writes
# the sections every benchmark node shares ([node] in NODE_DIR, [model],
# [parallel] and [weight_cache] from bench_device, [engine] with the built
# wsup-engine and KV_ARGS, a TOML list fragment, at the end of its
# command). The caller appends its own [probe], [front], [kv] ... after.
bench_node_config() {
  local file=$1 node=$2 name=$3 model=$4 kv_args=$5 ready_ms=$6
  mkdir -p "$node/state" "$node/run"
  chmod 700 "$node/run"
  cat > "$file" <<TOML
[node]
name = "$name"
state_dir = "$node/state"
runtime_dir = "$node/run"

[model]
path = "$model"
revision = "bench"

[parallel]
$devices_line

[weight_cache]
mode = "daemon"
backend = "$backend"

[engine]
command = ["$bin/wsup-engine", "--model", "{model}", "--port", "{port}", "--weight-cache", "{mode}",
           "--socket", "{socket}", "--device", "{devices}", "--revision", "{revision}", $kv_args]
host = "127.0.0.1"
primary_port = 0
standby_port = 0
ready_timeout_ms = $ready_ms

TOML
}
