#!/usr/bin/env bash
# The main job on a CPU: builds wsup, starts the demo node
# (`wsup start config/demo.toml`: a holder on the tiny test model, a primary
# and a standby engine attached to it, the front), sends a completion through
# the front, kills the active engine, shows that the standby took over and
# that a new standby was re-armed from the holder, stops (SIGSTOP) the new
# active engine and shows the front hedging its request to the standby,
# prints the report, and
# stops the node. Usage: scripts/demo.sh [--keep] (--keep leaves the node
# running; stop it with `build/bin/wsup stop --config config/demo.toml`).
set -euo pipefail
cd "$(dirname "$0")/.."
keep=${1:-}

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target wsup wsup-holder wsup-engine wsup-front
W=build/bin/wsup
CFG=config/demo.toml
mkdir -p build/demo
if $W status --config $CFG >/dev/null 2>&1; then $W stop --config $CFG >/dev/null; fi

echo "== wsup check $CFG"
$W check $CFG
echo "== wsup start $CFG (log: build/demo/wsup.log)"
setsid $W start $CFG > build/demo/wsup.log 2>&1 < /dev/null &
for _ in $(seq 1 300); do
  if $W status --config $CFG --json 2>/dev/null | grep -q '"state": "serving"'; then break; fi
  sleep 0.1
done
for _ in $(seq 1 100); do  # the standby proves itself a moment later
  [ "$($W status --config $CFG --json 2>/dev/null | grep -c '"semantic_ready": true')" = 2 ] && break
  sleep 0.1
done
$W status --config $CFG

front=$($W status --config $CFG --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["front"]["listen"])')
complete() {
  curl -s --max-time 20 "http://$front/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Hello, world", "max_tokens": 16, "temperature": 0, "return_token_ids": true}'
}
echo "== a completion through the front ($front)"
complete; echo

echo "== crash drill: SIGKILL the active engine"
$W failover --config $CFG --drill --kill
echo "== the same completion, now served by the standby"
complete; echo
for _ in $(seq 1 100); do
  [ "$($W status --config $CFG --json 2>/dev/null | grep -c '"semantic_ready": true')" = 2 ] && break
  sleep 0.1
done
echo "== re-armed: a new standby, attached to the holder's weights"
$W status --config $CFG

active_pid() {
  $W status --config $CFG --json | python3 -c '
import json, sys
print(next(e["pid"] for e in json.load(sys.stdin)["engines"] if e.get("role") == "active"))'
}
pid=$(active_pid)
echo "== hang drill: SIGSTOP the active engine (pid $pid); the front hedges to the standby after 200 ms"
kill -STOP "$pid"
t0=$(date +%s%N)
complete; echo
echo "answered in $(( ($(date +%s%N) - t0) / 1000000 )) ms; the supervisor's probes trip the stopped engine"
for _ in $(seq 1 200); do
  [ "$(active_pid)" != "$pid" ] && [ "$($W status --config $CFG --json 2>/dev/null | grep -c '"semantic_ready": true')" = 2 ] && break
  sleep 0.1
done
kill -CONT "$pid" 2>/dev/null || true  # killed by the supervisor already, unless it did not trip
$W status --config $CFG
echo "== wsup report --miss-tail"
$W report --config $CFG --miss-tail

if [ "$keep" = "--keep" ]; then
  echo "the node keeps running; stop it with: $W stop --config $CFG"
else
  $W stop --config $CFG
fi
