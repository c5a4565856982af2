#!/usr/bin/env bash
# Proxy overhead with wrk, in one run: the same engine reached directly,
# through wsup-front and through HAProxy (Debian's; plain reverse proxy,
# keep-alive to the engine), each with its default threads (one loop or
# thread per CPU) and with one. Two requests: GET /health (the
# proxy's own cost dominates) and a one-token greedy completion (POST,
# bench/front_post.lua); each at 1 connection (latency) and at each of CONNS
# connections (throughput). requests/s and p50/p99 latency from
# `wrk --latency`; the paths take turns, ROUNDS times, and each cell is the
# median of its rounds (a shared machine drifts; turns spread the drift).
#
# UPSTREAM=canned puts wsup-bench-upstream behind the proxies instead of the
# engine: it answers at once from one loop per CPU, so the proxies, not the
# engine's single HTTP loop, are what is measured (their capacity). Its
# answers are the engine's, byte for byte in size.
#
# Prints the table, writes OUTDIR/front.md and replaces its section of
# docs/benchmarks.md (DOC=path for another file, DOC=none for none).
#
#   bench/front.sh OUTDIR [BIN_DIR]
#
# Environment: DURATION [5] seconds per wrk run, ROUNDS [3], CONNS ["32 256"], THREADS [2]
#   (wrk threads), WSUP_BENCH_DEVICE [cpu] the engine's --device,
#   WSUP_BENCH_MODEL [testdata/llama-tiny-f32], UPSTREAM [engine] or canned,
#   TARGETS ["direct wsup wsup1 haproxy haproxy1"] (wsup1, haproxy1: one loop, one thread),
#   PIN [0]: 1 gives each party CPUs of its own (taskset): the upstream the first quarter, wrk the
#   next THREADS, the proxies the rest, so that the proxies' loops never take the CPUs the
#   engine's loop and scheduler need (at least 8 CPUs). Every process sizes its threads by the
#   CPUs it may run on.
#
# Beside requests/s and latency, each cell has the CPU time its server (the proxy; the upstream
# for direct) spent per request, over all its threads: behind an engine that is the cap, the
# proxies' rates tie, and this is what each would take from the engine's CPUs.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_args "usage: bench/front.sh OUTDIR [BIN_DIR]" "$@"
duration=${DURATION:-5}
rounds=${ROUNDS:-3}
conns=${CONNS:-32 256}
threads=${THREADS:-2}
device=${WSUP_BENCH_DEVICE:-cpu}
upstream=${UPSTREAM:-engine}
case "$upstream" in engine | canned) ;; *) echo "front.sh: UPSTREAM=$upstream: say engine or canned" >&2; exit 1 ;; esac
read -r -a targets <<< "${TARGETS:-direct wsup wsup1 haproxy haproxy1}"
pin=${PIN:-0}
on_up=() on_wrk=() on_proxy=() pin_note=""
if [ "$pin" = 1 ]; then
  ncpu=$(nproc)
  [ "$ncpu" -ge 8 ] || { echo "front.sh: PIN=1 needs at least 8 CPUs (this machine has $ncpu); use PIN=0" >&2; exit 1; }
  up_n=$((ncpu / 4))
  up_cpus="0-$((up_n - 1))"
  wrk_cpus="$up_n-$((up_n + threads - 1))"
  proxy_cpus="$((up_n + threads))-$((ncpu - 1))"
  on_up=(taskset -c "$up_cpus") on_wrk=(taskset -c "$wrk_cpus") on_proxy=(taskset -c "$proxy_cpus")
  pin_note="pinned: the upstream on CPUs $up_cpus, wrk on $wrk_cpus, the proxies on $proxy_cpus; "
  ha_threads=$((ncpu - up_n - threads))
fi
for t in "${targets[@]}"; do
  case "$t" in direct | wsup | wsup1 | haproxy | haproxy1) ;;
    *) echo "front.sh: TARGETS: unknown '$t'; use direct, wsup, wsup1, haproxy, haproxy1" >&2; exit 1 ;;
  esac
done
[[ " ${targets[*]} " == *" direct "* ]] ||
  { echo "front.sh: TARGETS must include direct: the added p50 is measured against it" >&2; exit 1; }
for p in wsup-engine wsup-front wsup-bench-upstream; do
  [ -x "$bin/$p" ] || { echo "front.sh: $bin/$p is missing; build it" >&2; exit 1; }
done
for p in wrk haproxy; do
  command -v $p >/dev/null || { echo "front.sh: $p is missing; run scripts/setup.sh" >&2; exit 1; }
done

read -r p_eng p_front p_front1 p_ha p_ha1 < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(5)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_port() {  # $1 port, $2 name
  for _ in $(seq 1 600); do
    if curl -s -o /dev/null "http://127.0.0.1:$1/health"; then return 0; fi
    sleep 0.1
  done
  echo "front.sh: $2 did not answer on port $1" >&2; exit 1
}

if [ "$upstream" = canned ]; then
  "${on_up[@]}" "$bin/wsup-bench-upstream" --port "$p_eng" > "$out/upstream.log" 2>&1 &
  pids+=($!) pid_up=$!
  wait_port "$p_eng" "the canned upstream"
  up_label="the canned upstream ($(grep -o '[0-9]* loops' "$out/upstream.log"))"
else
  model_in=${WSUP_BENCH_MODEL:-$repo/testdata/llama-tiny-f32}
  model=$(cd "$model_in" 2>/dev/null && pwd) ||
    { echo "front.sh: the engine's model $model_in is missing; set WSUP_BENCH_MODEL (or UPSTREAM=canned)" >&2; exit 1; }
  "${on_up[@]}" "$bin/wsup-engine" --model "$model" --port "$p_eng" --weight-cache off --device "$device" \
    > "$out/engine.log" 2>&1 &
  pids+=($!) pid_up=$!
  wait_port "$p_eng" "the engine"
  up_label="the engine"
fi
"${on_proxy[@]}" "$bin/wsup-front" --listen "127.0.0.1:$p_front" --active "127.0.0.1:$p_eng" > "$out/front.log" 2>&1 &
pids+=($!) pid_front=$!
wait_port "$p_front" "wsup-front"
"${on_proxy[@]}" "$bin/wsup-front" --listen "127.0.0.1:$p_front1" --active "127.0.0.1:$p_eng" --loops 1 > "$out/front1.log" 2>&1 &
pids+=($!) pid_front1=$!
wait_port "$p_front1" "wsup-front (1 loop)"
loops=$(grep -o 'with [0-9]* loops' "$out/front.log" | head -1 | awk '{print $2}')
haproxy_cfg() {  # $1 port, $2 "nbthread N" or ""
  cat <<CFG
global
  maxconn 4096
  $2

defaults
  mode http
  timeout connect 1s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
  http-reuse always

frontend clients
  bind 127.0.0.1:$1
  default_backend engine

backend engine
  server engine 127.0.0.1:$p_eng
CFG
}
haproxy_cfg "$p_ha" "${ha_threads:+nbthread $ha_threads}" > "$out/haproxy.cfg"
haproxy_cfg "$p_ha1" "nbthread 1" > "$out/haproxy-1thread.cfg"
declare -A pid_ha=()
for cfg in haproxy haproxy-1thread; do
  haproxy -c -q -f "$out/$cfg.cfg"
  "${on_proxy[@]}" haproxy -db -f "$out/$cfg.cfg" > "$out/$cfg.log" 2>&1 &
  pids+=($!) pid_ha[$cfg]=$!
done
wait_port "$p_ha" "HAProxy"
wait_port "$p_ha1" "HAProxy (1 thread)"

# CPU time (user + system, all threads) a process has used, in clock ticks.
cpu_ticks() { awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }

# One wrk run -> "rps p50_us p99_us ok|errors cpu_us_per_request": the last
# is the CPU time the serving process (the proxy, or the upstream for
# direct) spent per request answered, over every thread; it is what the
# proxy would take from an engine on the same CPUs.
run_wrk() {  # $1 port, $2 conns, $3 threads, $4 path, $5 lua or "", $6 pid of the server
  local args=(-t"$3" -c"$2" -d"${duration}s" --latency) before after
  [ -n "$5" ] && args+=(-s "$5")
  before=$(cpu_ticks "$6")
  "${on_wrk[@]}" wrk "${args[@]}" "http://127.0.0.1:$1$4" > "$out/wrk.txt" 2>&1
  after=$(cpu_ticks "$6")
  cat "$out/wrk.txt" >> "$out/wrk-all.txt"
  python3 - "$out/wrk.txt" "$((after - before))" "$(getconf CLK_TCK)" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
cpu_s = int(sys.argv[2]) / int(sys.argv[3])
answered = int(re.search(r"(\d+) requests in", t).group(1))
def us(v, unit):
    return float(v) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
lat = {m.group(1): us(m.group(2), m.group(3)) for m in re.finditer(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", t, re.M)}
errs = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", t)
print(f"{rps:.0f} {lat['50']:.0f} {lat['99']:.0f} {'errors' if errs else 'ok'} {cpu_s * 1e6 / max(answered, 1):.1f}")
PY
}

: > "$out/wrk-all.txt"
declare -A port=([direct]=$p_eng [wsup]=$p_front [wsup1]=$p_front1 [haproxy]=$p_ha [haproxy1]=$p_ha1)
declare -A server=([direct]=$pid_up [wsup]=$pid_front [wsup1]=$pid_front1 [haproxy]=${pid_ha[haproxy]}
                   [haproxy1]=${pid_ha[haproxy-1thread]})
declare -A label=([direct]="direct to $up_label" [wsup]="wsup-front, $loops loops" [wsup1]="wsup-front, 1 loop"
                  [haproxy]="HAProxy, ${ha_threads:-$(nproc)} threads" [haproxy1]="HAProxy, 1 thread")
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
rows=()
for req in "GET /health" "POST /v1/completions (1 token)"; do
  if [ "$req" = "GET /health" ]; then path=/health; lua=""; else path=/; lua="$repo/bench/front_post.lua"; fi
  for c in 1 $conns; do
    t=1; [ "$c" != 1 ] && t=$threads
    declare -A rps=() p50=() p99=() err=() cpu=()
    for round in $(seq 1 "$rounds"); do
      for target in "${targets[@]}"; do
        echo "== $req, $c connection(s), ${label[$target]}, round $round" >&2
        read -r a b d e f <<< "$(run_wrk "${port[$target]}" "$c" "$t" "$path" "$lua" "${server[$target]}")"
        rps[$target]+="$a "; p50[$target]+="$b "; p99[$target]+="$d "; cpu[$target]+="$f "
        [ "$e" = ok ] || err[$target]=1
      done
    done
    d50=$(median ${p50[direct]})
    for target in "${targets[@]}"; do
      m50=$(median ${p50[$target]})
      added="-"; [ "$target" != direct ] && added=$((m50 - d50))
      rows+=("| $req | $c | ${label[$target]} | $(median ${rps[$target]}) | $m50 | $(median ${p99[$target]}) | $added | $(median ${cpu[$target]}) |$( [ -z "${err[$target]:-}" ] || echo " wrk reported errors")")
    done
    unset rps p50 p99 err cpu
  done
done
cleanup
trap - EXIT

pin_env=""; [ "$pin" = 1 ] && pin_env="PIN=1 "
cpu_model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
{
  if [ "$upstream" = canned ]; then
    echo "Machine: $cpu_model, $(nproc) CPUs; upstream: $up_label (wsup-bench-upstream: the engine's answers, at once); wrk, client and"
  else
    echo "Machine: $cpu_model, $(nproc) CPUs; engine --device $device, model $(basename "$model"); wrk, client and"
  fi
  echo "servers on the same machine; ${pin_note}${duration} s per run, median of $rounds rounds; $(date -u +%Y-%m-%d)."
  echo "HAProxy $(haproxy -v | head -1 | awk '{print $3}'), its threads by default one per CPU (nbthread); wsup-front"
  echo "by default one loop per CPU (--loops 0: $loops here)."
  echo
  echo '```sh'
  if [ "$upstream" = canned ]; then
    echo "${pin_env}UPSTREAM=canned TARGETS=\"${targets[*]}\" DURATION=$duration ROUNDS=$rounds CONNS=\"$conns\" THREADS=$threads bench/front.sh OUTDIR BIN_DIR"
  else
    echo "${pin_env}TARGETS=\"${targets[*]}\" DURATION=$duration ROUNDS=$rounds CONNS=\"$conns\" THREADS=$threads WSUP_BENCH_DEVICE=$device bench/front.sh OUTDIR BIN_DIR"
  fi
  echo '```'
  echo
  echo "| request | connections | path | requests/s | p50 (us) | p99 (us) | added p50 vs direct (us) | CPU per request (us) |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} > "$out/front.md"
cat "$out/front.md"
if [ "$doc" != none ]; then
  heading="## Proxy overhead, wsup-front beside HAProxy, engine on $device (\`bench/front.sh\`)"
  if [ "$upstream" = canned ]; then
    heading="## Proxy capacity, wsup-front beside HAProxy, a canned upstream on every CPU (\`bench/front.sh\` UPSTREAM=canned)"
  fi
  python3 "$repo/bench/doc_section.py" "$doc" "$heading" "$out/front.md"
  echo "wrote the section to $doc"
fi
