#!/usr/bin/env bash
# Failover under load, wsup beside HAProxy, in one run on the same engines.
#
# Starts one wsup node (`wsup start config/demo.toml` with overrides: a
# holder, a primary and a standby engine on ports picked here, the front),
# then HAProxy (Debian's) with the same two engines as `primary` and
# `backup`. wsup-bench-failover runs CLIENTS concurrent clients (half
# streaming) for at least DURATION seconds with DRILLS crash drills (SIGKILL
# of the active engine) and DRILLS planned drills, first through the front,
# then through HAProxy in two setups:
#   - "HAProxy": health check = the probe completion POSTed every 100 ms,
#     expecting the golden token ids (http-check send / expect string), fall 2,
#     rise 2; retries 3 with retry-on all-retryable-errors; option redispatch;
#   - "HAProxy + observe": the same, and a server is marked down at the first
#     connection error seen in live traffic (observe layer4, error-limit 1,
#     on-error mark-down).
# Every answer is checked against the golden outputs. The supervisor
# restarts a killed engine on its port, for both proxies.
#
# Prints the table, writes OUTDIR/failover.md (with the runs' JSON beside it)
# and replaces its section of docs/benchmarks.md (DOC=path to write another
# file, DOC=none for none).
#
#   bench/failover.sh OUTDIR [BIN_DIR]
#
# Environment (defaults in brackets):
#   CLIENTS [16]  DURATION [60] seconds  DRILLS [10] of each kind
#   PROBE_MS [50]  an open-loop 2-token probe stream every PROBE_MS (0: none), and
#                  every 5 ms for 150 ms from each drill
#   WSUP_BENCH_DEVICE [cpu]    the engines' --device (cuda:0 on a GPU node)
#   WSUP_BENCH_BACKEND [host]  the weight cache (holder) backend: host | cuda
#   WSUP_BENCH_MODEL [testdata/llama-tiny-f32]  a checkpoint folder with golden.json
#   WSUP_BENCH_PROBE_MS [1000] the supervisor's probe interval and timeout (above
#                              the loaded engines' latency, or probes trip them)
#   HANG [0]      hang drills (SIGSTOP of the active engine) per proxy, in turn with the others
#   HEDGE_MS [200] the front's hedge_after_ms in the "wsup + hedging" run
#   TARGETS ["wsup haproxy haproxy-observe"]  which runs to make; "wsup-hedge" adds a
#                  run through the same front with hedging on (set over its control
#                  socket for that run, then off again)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_args "usage: bench/failover.sh OUTDIR [BIN_DIR]" "$@"
clients=${CLIENTS:-16}
probe_every=${PROBE_MS:-50}
duration=${DURATION:-60}
drills=${DRILLS:-10}
hang=${HANG:-0}
hedge_ms=${HEDGE_MS:-200}
device=${WSUP_BENCH_DEVICE:-cpu}
backend=${WSUP_BENCH_BACKEND:-host}
model=$(cd "${WSUP_BENCH_MODEL:-$repo/testdata/llama-tiny-f32}" && pwd)
probe_ms=${WSUP_BENCH_PROBE_MS:-1000}
targets=" ${TARGETS:-wsup haproxy haproxy-observe} "
bench_need wsup wsup-holder wsup-engine wsup-front wsup-bench-failover
command -v haproxy >/dev/null || { echo "failover.sh: haproxy is missing; run scripts/setup.sh" >&2; exit 1; }
[ -f "$model/golden.json" ] || { echo "failover.sh: $model/golden.json is missing" >&2; exit 1; }

node=$out/node
rm -rf "$node" && mkdir -p "$node"
read -r p_front p_a p_b p_ha p_ha2 < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(5)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')

# The probe, from the golden outputs: case 0, greedy, all its tokens.
read -r probe_prompt_json probe_ids probe_body < <(python3 - "$model/golden.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["cases"][0]
ids = ",".join(str(i) for i in c["output_ids"])
body = json.dumps({"prompt": c["prompt_ids"], "max_tokens": len(c["output_ids"]), "temperature": 0,
                   "return_token_ids": True}, separators=(",", ":"))
print(json.dumps(c["prompt"]).replace(" ", "\\u0020"), ids, body)
PY
)
ntok=$(echo "$probe_ids" | tr ',' '\n' | wc -l)

sets=(
  "node.state_dir=$node/state"
  "node.runtime_dir=$node/run"
  "model.path=$model"
  "weight_cache.backend=\"$backend\""
  "engine.command=[\"$bin/wsup-engine\", \"--model\", \"{model}\", \"--port\", \"{port}\", \"--weight-cache\", \"{mode}\", \"--socket\", \"{socket}\", \"--device\", \"$device\", \"--revision\", \"{revision}\", \"--kv-cache-mib\", \"16\"]"
  "engine.primary_port=$p_a"
  "engine.standby_port=$p_b"
  "front.listen=127.0.0.1:$p_front"
  "admin.listen=127.0.0.1:0"
  "probe.prompt=$probe_prompt_json"
  "probe.expect_token_ids=[$probe_ids]"
  "probe.max_tokens=$ntok"
  "probe.interval_ms=$probe_ms"
  "probe.timeout_ms=$probe_ms"
  "probe.jitter_ms=0"
  "supervisor.max_restarts=100000"
  "front.hedge_after_ms=0"  # hedging only in the wsup-hedge run (set on the front for it)
)
# GPUs: one device per tensor-parallel rank (cuda:0 -> [0]; cuda:0,1 -> [0,1], tp 2).
if [ "$device" != cpu ]; then
  gpus=${device#cuda:}
  sets+=("parallel.devices=[$gpus]" "parallel.tp=$(echo "$gpus" | tr ',' '\n' | wc -l)")
fi
args=()
for s in "${sets[@]}"; do args+=(--set "$s"); done
W=("$bin/wsup")
sock=$node/run/wsup.sock

sup_pid=""
ha_pid=""
cleanup() {
  [ -n "$ha_pid" ] && kill "$ha_pid" 2>/dev/null || true
  if [ -n "$sup_pid" ]; then
    "${W[@]}" stop --socket "$sock" >/dev/null 2>&1 || kill "$sup_pid" 2>/dev/null || true
    for _ in $(seq 1 300); do kill -0 "$sup_pid" 2>/dev/null || break; sleep 0.1; done
  fi
}
trap cleanup EXIT

echo "== wsup node: front 127.0.0.1:$p_front, engines 127.0.0.1:$p_a and :$p_b ($device, $backend weights)"
setsid "${W[@]}" start "$repo/config/demo.toml" "${args[@]}" > "$node/supervisor.log" 2>&1 < /dev/null &
sup_pid=$!
ready=0
for _ in $(seq 1 1200); do
  if [ "$("${W[@]}" status --socket "$sock" --json 2>/dev/null | grep -c '"semantic_ready": true')" = 2 ]; then
    ready=1; break
  fi
  kill -0 "$sup_pid" 2>/dev/null || break
  sleep 0.1
done
if [ $ready != 1 ]; then
  echo "failover.sh: the node did not get two proven engines; see $node/supervisor.log" >&2
  tail -20 "$node/supervisor.log" >&2
  exit 1
fi

haproxy_cfg() {  # $1: port, $2: extra default-server options
  cat <<EOF
global
  stats socket $out/haproxy-$1.sock mode 600 level admin
  maxconn 4096

defaults
  mode http
  timeout connect 200ms
  timeout client 60s
  timeout server 60s
  timeout check 1s
  retries 3
  option redispatch 1
  retry-on all-retryable-errors

frontend clients
  bind 127.0.0.1:$1
  default_backend engines

backend engines
  option httpchk
  http-check send meth POST uri /v1/completions ver HTTP/1.1 hdr Host localhost hdr Content-Type application/json body '$probe_body'
  http-check expect string [$probe_ids]
  default-server inter 100ms fastinter 100ms downinter 100ms rise 2 fall 2 $2
  server primary 127.0.0.1:$p_a check
  server backup 127.0.0.1:$p_b check backup
EOF
}

run_haproxy() {  # $1: port, $2: label, $3: file stem, $4: extra default-server options
  haproxy_cfg "$1" "$4" > "$out/$3.cfg"
  haproxy -c -q -f "$out/$3.cfg"
  haproxy -db -f "$out/$3.cfg" > "$out/$3.log" 2>&1 &
  ha_pid=$!
  echo "== $2 (127.0.0.1:$1, $out/$3.cfg)"
  "$bin/wsup-bench-failover" --target haproxy --label "$2" --url "127.0.0.1:$1" --golden "$model/golden.json" \
    --clients "$clients" --seconds "$duration" --crash "$drills" --planned "$drills" --hang "$hang" --probe-ms "$probe_every" \
    --haproxy-stats "$out/haproxy-$1.sock" --primary-port "$p_a" --backup-port "$p_b" \
    --supervisor-socket "$sock" --out "$out/$3.json" --records "$out/$3-requests.json" || true
  kill "$ha_pid"; wait "$ha_pid" 2>/dev/null || true
  ha_pid=""
}

# set_limits on the front's control socket (4-byte little-endian length + JSON).
front_hedging() {  # $1: hedge_after_ms (0: off)
  python3 - "$node/run/front.sock" "$1" <<'PY'
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
m = json.dumps({"type": "set_limits", "queue_timeout_ms": 10000, "max_queued": 1024,
                "hedge_after_ms": int(sys.argv[2]), "hedge_percent": 10, "hedge_burst": 16}).encode()
s.sendall(struct.pack("<I", len(m)) + m)
n = struct.unpack("<I", s.recv(4, socket.MSG_WAITALL))[0]
r = json.loads(s.recv(n, socket.MSG_WAITALL))
sys.exit(0 if r.get("ok") else print("set_limits:", r) or 1)
PY
}

run_wsup() {  # $1: label, $2: file stem
  echo "== $1: wsup front (127.0.0.1:$p_front)"
  "$bin/wsup-bench-failover" --target wsup --label "$1" --url "127.0.0.1:$p_front" --golden "$model/golden.json" \
    --clients "$clients" --seconds "$duration" --crash "$drills" --planned "$drills" --hang "$hang" \
    --probe-ms "$probe_every" --supervisor-socket "$sock" --front-socket "$node/run/front.sock" \
    --out "$out/$2.json" --records "$out/$2-requests.json" || true
}

[[ $targets == *" wsup "* ]] && run_wsup wsup wsup
if [[ $targets == *" wsup-hedge "* ]]; then
  front_hedging "$hedge_ms"
  run_wsup "wsup + hedging ${hedge_ms} ms" wsup-hedge
  front_hedging 0
fi
[[ $targets == *" haproxy "* ]] && run_haproxy "$p_ha" "HAProxy" haproxy ""
[[ $targets == *" haproxy-observe "* ]] &&
  run_haproxy "$p_ha2" "HAProxy + observe" haproxy-observe "observe layer4 error-limit 1 on-error mark-down"
cleanup
trap - EXIT

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
gpu=""
if [ "$device" != cpu ]; then gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true); fi
runs=()
for f in wsup wsup-hedge haproxy haproxy-observe; do [ -f "$out/$f.json" ] && runs+=("$out/$f.json"); done
{
  echo "Machine: $cpu, $(nproc) CPUs${gpu:+, $gpu}; engines --device $device, $backend weight cache;"
  echo "model $(basename "$model"); $clients clients (half streaming) and a 2-token probe stream every $probe_every ms"
  echo "(every 5 ms for 150 ms from each drill);"
  echo "$drills crash + $drills planned + $hang hang drills per proxy;"
  echo "$(date -u +%Y-%m-%d). HAProxy $(haproxy -v | head -1 | awk '{print $3}')."
  echo
  echo '```sh'
  echo "CLIENTS=$clients DURATION=$duration DRILLS=$drills HANG=$hang HEDGE_MS=$hedge_ms TARGETS=\"$(echo $targets)\" PROBE_MS=$probe_every WSUP_BENCH_DEVICE=$device WSUP_BENCH_BACKEND=$backend bench/failover.sh OUTDIR BIN_DIR"
  echo '```'
  echo
  "$bin/wsup-bench-failover" --table "${runs[@]}"
} > "$out/failover.md"
cat "$out/failover.md"
for f in "${runs[@]}"; do
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["completed"] else print(sys.argv[1]+": "+r["error"]) or 1)' "$f" \
    || echo "failover.sh: that run stopped early" >&2
done
if [ "$doc" != none ]; then
  python3 "$repo/bench/doc_section.py" "$doc" \
    "## Failover under load, wsup beside HAProxy: engines on $device, $clients clients (\`bench/failover.sh\`)" \
    "$out/failover.md"
  echo "wrote the section to $doc"
fi
