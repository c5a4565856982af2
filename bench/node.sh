#!/usr/bin/env bash
# A whole wsup node on a GPU: `wsup start` with the cuda backend (one holder
# keeping the weights in GPU memory, a primary and a standby wsup-engine on
# --device cuda:N both mapping them), then, in one run:
#   1. nvidia-smi's per-process GPU memory: the weights are held once (by
#      the holder) and the two engines add only their own caches;
#   2. the supervisor's CPU time and peak RSS while clients stream through
#      the front for LOAD_SECS seconds;
#   3. DRILLS crash drills (`wsup failover --drill --kill`): kill to swap and
#      kill to the first correct answer through the front, each followed by
#      the re-armed standby proving itself again (a cache hit).
# The model is a generated Llama (wsup-gen-llama, about 1.1B parameters,
# 2.1 GiB of bf16) so that a weight copy is visible in nvidia-smi; the probe's
# expected answer is recorded from it first with a plain engine.
#
# With KV_POOL_MIB, the node keeps a KV pool of that many MiB per rank
# ([kv] pool_mib; engines --kv-pool with a scratch of SCRATCH_MIB): the
# active engine maps the pool, the standby serves from its scratch, and the
# drills add kill to the old engine's exit and to the promoted engine's full
# KV (the ledger's gone_ms and kv_full_ms). Without it each engine has a
# private cache of KV_MIB. FILL_GIB holds that much more GPU memory in a
# process of its own for the whole run (a GPU left nearly full).
#
# With ROLL=1, after the drills: a rolling upgrade under load (`wsup reload`
# once "--max-batch 32" is added to the engine command in the node's config
# file), timed, with 4 streaming clients' requests before, during and after.
#
# With ENGINE_LOG_LEVEL=debug the engines log each request's timing and the
# KV pool's work between steps; bench/drill_timeline.py OUTDIR then lines
# each drill up against the promoted engine's account of its proof.
#
#   bench/node.sh OUTDIR [BIN_DIR]    # DEVICE=cuda:0 DRILLS=10 LOAD_SECS=10 KV_POOL_MIB=0 KV_MIB=2048 ROLL=0
# Prints a table and writes it to OUTDIR/node.md (and OUTDIR/node.json).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_args "usage: bench/node.sh OUTDIR [BIN_DIR]" "$@"
bench_need wsup wsup-engine wsup-holder wsup-front wsup-gen-llama
device=${DEVICE:-cuda:0}
dev=${device#cuda:}    # "0", or "0,1" for tensor parallelism over two GPUs
bench_device "$device"
model=${MODEL_DIR:-/tmp/wsup-bench-llama}
drills=${DRILLS:-10}
load_secs=${LOAD_SECS:-10}
kv_mib=${KV_MIB:-2048}; [ "$device" = cpu ] && kv_mib=${KV_MIB:-64}
pool_mib=${KV_POOL_MIB:-0}
scratch_mib=${SCRATCH_MIB:-64}
fill_gib=${FILL_GIB:-0}
W="$bin/wsup"

[ -f "$model/config.json" ] || "$bin/wsup-gen-llama" --out "$model" | tee "$out/gen.txt"

# The probe's answer: 8 greedy tokens of a plain engine on the same model.
expect=$(bench_record_expect "$model" "$device" "$out/record.log")
echo "probe answer: $expect"

# A process that only holds GPU memory (and one that only holds a CUDA
# context, to measure a bare context), through the driver: no torch needed.
gpu_holder() {  # gpu_holder BYTES -> runs until killed (the caller's $! is python's pid)
  exec python3 - "$dev" "$1" <<'PY'
import ctypes, signal, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
dev, nbytes = int(sys.argv[1].split(",")[0]), int(sys.argv[2])
assert cuda.cuInit(0) == 0
d = ctypes.c_int(); assert cuda.cuDeviceGet(ctypes.byref(d), dev) == 0
ctx = ctypes.c_void_p(); assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), d) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
if nbytes:
    p = ctypes.c_uint64(); assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)) == 0
print("holding", flush=True)
signal.sigwait([signal.SIGTERM])
PY
}
filler=""
if [ "$fill_gib" != 0 ]; then
  gpu_holder $((fill_gib << 30)) > "$out/filler.log" 2>&1 &
  filler=$!
  for _ in $(seq 1 300); do grep -q holding "$out/filler.log" && break; sleep 0.1; done
fi

node="$out/node"
rm -rf "$node"
cfg="$node/node.toml"
if [ "$pool_mib" != 0 ]; then
  kv_args='"--kv-pool", "--kv-scratch-mib", "{kv_scratch_mib}"'
  kv_section="[kv]
pool_mib = $pool_mib
scratch_mib = $scratch_mib"
else
  kv_args="\"--kv-cache-mib\", \"$kv_mib\""
  kv_section=""
fi
if [ -n "${ENGINE_LOG_LEVEL:-}" ]; then kv_args="$kv_args, \"--log-level\", \"$ENGINE_LOG_LEVEL\""; fi
bench_node_config "$cfg" "$node" bench-gpu "$model" "$kv_args" 120000
cat >> "$cfg" <<EOF
[probe]
kind = "semantic"
prompt = "Hello, world"
expect_token_ids = $expect
max_tokens = 8
interval_ms = 250
timeout_ms = 250
failures = 3
successes = 2
jitter_ms = 20
comm = true
comm_max_age_ms = 5000

[front]
listen = "127.0.0.1:0"
queue_timeout_ms = 10000

[admin]
listen = "127.0.0.1:0"

$kv_section
EOF
"$W" check "$cfg"
setsid "$W" start "$cfg" > "$out/wsup.log" 2>&1 < /dev/null &
sup=$!
ready2() { "$W" status --config "$cfg" --json 2>/dev/null | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if sorted(e["role"] for e in s["engines"] if e["semantic_ready"]) == ["active", "standby"] else 1)' 2>/dev/null; }
for _ in $(seq 1 1200); do ready2 && break; sleep 0.1; done
"$W" status --config "$cfg" | tee "$out/status.txt"
"$W" status --config "$cfg" --json > "$out/status.json"
front=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["front"]["listen"])' "$out/status.json")

# With a pool: the active maps it once the grant is back (a few ms after
# both are proven).
if [ "$pool_mib" != 0 ]; then
  for _ in $(seq 1 300); do
    "$W" status --config "$cfg" --json | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if s.get("kv_pool",{}).get("state") == "held" and all("kv" in e and "memory" in e for e in s["engines"]) else 1)' && break
    sleep 0.1
  done
  "$W" status --config "$cfg" --json > "$out/status.json"
fi
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$out/gpu_apps.csv" || true
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits -i "${dev%%,*}" > "$out/gpu_used.txt" || true
# A bare CUDA context on the same GPU, for comparison.
if [ "$device" != cpu ]; then
  gpu_holder 0 > "$out/bare.log" 2>&1 &
  bare=$!
  for _ in $(seq 1 300); do grep -q holding "$out/bare.log" && break; sleep 0.1; done
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
    awk -F', ' -v p="$bare" '$1 == p {print $2}' > "$out/bare_mib.txt" || true
  kill "$bare"; wait "$bare" || true
fi

# Load through the front while the supervisor's CPU is measured.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
t0=$(cpu_ticks "$sup"); s0=$(date +%s.%N)
python3 - "$front" "$load_secs" > "$out/load.txt" <<'PY'
import sys, time, threading, urllib.request
front, secs = sys.argv[1], float(sys.argv[2])
body = b'{"prompt": "Hello, world", "max_tokens": 32, "temperature": 0, "stream": true}'
done, failed, end = [0], [0], time.time() + secs
def client():
    while time.time() < end:
        try:
            req = urllib.request.Request(f"http://{front}/v1/completions", data=body, headers={"Content-Type": "application/json"})
            r = urllib.request.urlopen(req, timeout=30).read()
            if b"[DONE]" in r: done[0] += 1
            else: failed[0] += 1
        except Exception:
            failed[0] += 1
ts = [threading.Thread(target=client) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print(done[0], failed[0])
PY
t1=$(cpu_ticks "$sup"); s1=$(date +%s.%N)
hwm=$(awk '/VmHWM/{print $2}' "/proc/$sup/status")
rss=$(awk '/VmRSS/{print $2}' "/proc/$sup/status")
reqs=$(awk '{print $1 " ok, " $2 " failed"}' "$out/load.txt")

# Crash drills.
: > "$out/drills.jsonl"
for i in $(seq 1 "$drills"); do
  for _ in $(seq 1 600); do ready2 && break; sleep 0.1; done
  "$W" failover --config "$cfg" --drill --kill --json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >> "$out/drills.jsonl" || true
  if [ "$i" = 1 ]; then
    # The promoted standby's communicator after the takeover (its latest
    # keepalive all-reduce over the whole group), beside the fresh
    # communicator the re-armed slot builds at the same moment.
    sleep 1.5
    "$W" status --config "$cfg" --json > "$out/status_after_takeover.json"
    python3 - "$out/status_after_takeover.json" "$node/run/state.json" > "$out/comm_after_takeover.json" <<'PY' || true
import json, sys, time, urllib.request
st = json.load(open(sys.argv[1]))
out = {}
for e in st["engines"]:
    for _ in range(300):
        try:
            # The control routes take the engine's token (the node's 0600 state.json).
            tokens = {x["slot"]: x.get("control_token", "") for x in json.load(open(sys.argv[2]))["engines"]}
            req = urllib.request.Request(f"http://127.0.0.1:{e['port']}/wsup/status",
                                         headers={"Authorization": "Bearer " + tokens.get(e["slot"], "")})
            s = json.load(urllib.request.urlopen(req, timeout=2))
            if s.get("state") == "ready":
                break
        except Exception:
            pass
        time.sleep(0.1)
    out[e["role"]] = {"keepalive_latency_us": s["comm"].get("keepalive_latency_us"),
                      "keepalives": s["comm"].get("keepalives"),
                      "communicator_init_ms": s["phases"].get("communicator"),
                      "ranks": s["comm"].get("ranks")}
print(json.dumps(out))
PY
  fi
done
for _ in $(seq 1 600); do ready2 && break; sleep 0.1; done
# With ROLL=1: a rolling upgrade under load (`wsup reload` after a flag is
# added to the engine command in the config file), timed from the reload
# to both engines on the new version, with every request of 4 streaming
# clients recorded (before, during and after the roll).
if [ "${ROLL:-0}" = 1 ]; then
  for _ in $(seq 1 600); do ready2 && break; sleep 0.1; done
  python3 - "$front" "$out/roll_stop" > "$out/roll_load.jsonl" <<'PY' &
import json, os, sys, time, threading, urllib.request
front, stop = sys.argv[1], sys.argv[2]
body = b'{"prompt": "Hello, world", "max_tokens": 32, "temperature": 0, "stream": true}'
lock = threading.Lock()
def client():
    while not os.path.exists(stop):
        t0 = time.time(); ok = False; err = ""
        try:
            req = urllib.request.Request(f"http://{front}/v1/completions", data=body, headers={"Content-Type": "application/json"})
            r = urllib.request.urlopen(req, timeout=60).read()
            ok = b"[DONE]" in r
        except Exception as e:
            err = str(e)[:200]
        with lock:
            print(json.dumps({"start": t0, "end": time.time(), "ok": ok, "error": err}), flush=True)
ts = [threading.Thread(target=client) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
PY
  roll_load=$!
  sleep 2
  python3 - "$cfg" <<'PY'
import sys
p = sys.argv[1]
t = open(p).read()
t = t.replace('"--revision", "{revision}",', '"--revision", "{revision}", "--max-batch", "32",', 1)
open(p + ".new", "w").write(t)
PY
  mv "$cfg.new" "$cfg"
  r0=$(date +%s.%N)
  "$W" reload --config "$cfg" --json > "$out/roll.json" || true
  r1=$(date +%s.%N)
  sleep 2
  touch "$out/roll_stop"; wait "$roll_load" || true
  "$W" status --config "$cfg" --json > "$out/status_after_roll.json" || true
  echo "$r0 $r1" > "$out/roll_times.txt"
fi
"$W" report --config "$cfg" > "$out/report.txt" || true
"$W" stop --config "$cfg" || kill "$sup"
wait "$sup" || true
if [ -n "$filler" ]; then kill "$filler"; wait "$filler" || true; fi

python3 - "$out" "$t0" "$t1" "$s0" "$s1" "$hwm" "$rss" "$reqs" "$(getconf CLK_TCK)" "$device" "$node/state/wsup.db" "$pool_mib" "$scratch_mib" "$kv_mib" "$fill_gib" <<'PY'
import json, sys, statistics, datetime, subprocess, sqlite3
out, t0, t1, s0, s1, hwm, rss, reqs, hz, device, db, pool_mib, scratch_mib, kv_mib, fill_gib = sys.argv[1:]
st = json.load(open(f"{out}/status.json"))
def kv_of(e):
    kv = e.get("kv") or {}
    return f", KV {kv.get('source', '?')} {kv.get('bytes', 0) >> 20} MiB" if kv else ""
pids = {e["pid"]: f"engine {e['slot']} ({e['role']}{kv_of(e)})" for e in st["engines"]}
pids.update({h["pid"]: "holder" for h in st["holders"]})
apps = []
import os
for line in (open(f"{out}/gpu_apps.csv") if os.path.exists(f"{out}/gpu_apps.csv") else []):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 2 and parts[0].isdigit():
        apps.append((pids.get(int(parts[0]), f"pid {parts[0]}"), int(parts[1])))
used_total = open(f"{out}/gpu_used.txt").read().strip().split(",") if os.path.exists(f"{out}/gpu_used.txt") else ["n/a"]
used = used_total[0].strip()
bare = open(f"{out}/bare_mib.txt").read().strip() if os.path.exists(f"{out}/bare_mib.txt") else ""
# The ledger's own times of each crash drill: the old engine's exit seen
# (gone_ms) and, with a pool, the promoted engine's full KV (kv_full_ms).
rows = sqlite3.connect(db).execute(
    "SELECT fault_ms, swapped_ms, first_ok_ms, gone_ms, kv_full_ms FROM failovers WHERE drill = 1 ORDER BY id").fetchall()
gone = [r[3] - r[0] for r in rows if r[3] is not None]
kv_full = [r[4] - r[0] for r in rows if r[4] is not None]
kv_after = [r[4] - r[3] for r in rows if r[4] is not None and r[3] is not None]
d = [json.loads(l) for l in open(f"{out}/drills.jsonl") if l.strip()]
ok = [x for x in d if x.get("ok")]
def pct(v, p):
    v = sorted(v); return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else float("nan")
swap = [x["swap_ms"] for x in ok]; first = [x["first_ok_ms"] for x in ok]
cpu_s = (float(t1) - float(t0)) / float(hz); wall = float(s1) - float(s0)
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip().splitlines()
except OSError:
    gpu = []
kv_line = (f"KV pool {pool_mib} MiB per rank (scratch {scratch_mib} MiB)" if pool_mib != "0"
           else f"private KV cache {kv_mib} MiB per engine")
md = [f"Machine: {gpu[0] if gpu else 'unknown'}; device {device}; {kv_line}"
      + (f"; {fill_gib} GiB held by another process" if fill_gib != "0" else "")
      + f"; {datetime.date.today().isoformat()}", "",
      "| GPU memory (nvidia-smi, per process) | MiB |", "|---|---:|"]
md += [f"| {name} | {mib} |" for name, mib in apps]
if bare:
    md += [f"| a bare CUDA context (another process, for comparison) | {bare} |"]
md += [f"| whole GPU (memory.used) | {used} |", "",
       "| supervisor while serving | measured |", "|---|---|",
       f"| load | 4 clients streaming 32-token completions through the front for {wall:.1f} s: {reqs} requests |",
       f"| supervisor CPU | {cpu_s:.2f} s over {wall:.1f} s = {100 * cpu_s / wall:.1f}% of one core |",
       f"| supervisor RSS | {int(rss) / 1024:.1f} MiB now, peak {int(hwm) / 1024:.1f} MiB |", "",
       f"| crash drills (`wsup failover --drill --kill`), n = {len(ok)} of {len(d)} | p50 | p99 | max |", "|---|---:|---:|---:|",
       f"| kill to swap (ms) | {pct(swap, 50)} | {pct(swap, 99)} | {max(swap) if swap else 'nan'} |",
       f"| kill to first correct answer through the front (ms) | {pct(first, 50)} | {pct(first, 99)} | {max(first) if first else 'nan'} |",
       f"| kill to the killed engine's exit (ms, the ledger's gone_ms) | {pct(gone, 50)} | {pct(gone, 99)} | {max(gone) if gone else 'nan'} |"]
if kv_full:
    md += [f"| kill to the promoted engine's full KV (ms, kv_full_ms) | {pct(kv_full, 50)} | {pct(kv_full, 99)} | {max(kv_full)} |",
           f"| the killed engine's exit to the promoted engine's full KV (ms) | {pct(kv_after, 50)} | {pct(kv_after, 99)} | {max(kv_after) if kv_after else 'nan'} |"]
# The promoted engines' own account of each mapping (their logs): the fds
# fetched at the grant or ahead of it, the import, the mapping, the access.
import glob, re
parts = []
pat = re.compile(r"mapped in ([\d.]+) ms \((prefetched; take|fetch) ([\d.]+) ms, import ([\d.]+), map ([\d.]+), access ([\d.]+)\)")
for f in glob.glob(f"{out}/node/**/*.log", recursive=True) + glob.glob(f"{out}/node/**/*.out", recursive=True):
    for line in open(f, errors="replace"):
        m = pat.search(line)
        if m:
            parts.append({"total": float(m[1]), "ahead": m[2].startswith("prefetched"), "fetch": float(m[3]),
                          "import": float(m[4]), "map": float(m[5]), "access": float(m[6])})
ahead = [x for x in parts if x["ahead"]]
if parts:
    md += ["", f"| the promoted engine's mapping of the pool (its log), n = {len(parts)}, {len(ahead)} fetched and imported ahead | p50 | p99 |", "|---|---:|---:|"]
    for k, label in (("total", "the role request to mapped (ms)"), ("fetch", "getting the fds at the grant (ms)"),
                     ("import", "importing them at the grant (ms)"), ("map", "mapping (ms)"), ("access", "granting access (ms)")):
        v = [x[k] for x in parts]
        md += [f"| {label} | {pct(v, 50):.2f} | {pct(v, 99):.2f} |"]
# Where each engine's own GPU memory went, by startup phase (NVML deltas).
phases = ["context", "weights", "communicator", "kv_cache", "graph_capture", "warmup"]
by = [(e, (e.get("memory") or {}).get("by_phase")) for e in st["engines"]]
if any(b for _, b in by):
    md += ["", "| engine's own GPU memory by startup phase (MiB, NVML) | " + " | ".join(phases) + " |",
           "|---|" + "---:|" * len(phases)]
    for e, b in by:
        if b:
            md += [f"| engine {e['slot']} ({e['role']}{kv_of(e)}) | " + " | ".join(str(b.get(p, 0) >> 20) for p in phases) + " |"]
json.dump({"map_parts": parts, "by_phase": {e["slot"]: b for e, b in by if b}, "apps": apps, "used_mib": used, "bare_mib": bare, "swap": swap, "first_ok": first, "gone": gone,
           "kv_full": kv_full, "kv_after_gone": kv_after, "pool_mib": pool_mib, "kv_mib": kv_mib,
           "scratch_mib": scratch_mib,
           "fill_gib": fill_gib, "engines": st["engines"], "holders": st["holders"]},
          open(f"{out}/node.json", "w"), indent=1)
try:
    c = json.load(open(f"{out}/comm_after_takeover.json"))
    a = c.get("active", {})
    s_ = next((v for k, v in c.items() if k != "active"), {})  # standby, or still warming
    md += ["", f"| communicator, {a.get('ranks')} rank(s), after the first takeover | measured |", "|---|---|",
           f"| promoted standby: latest all-reduce over the group ({a.get('keepalives')} keepalives since it started) | {a.get('keepalive_latency_us')} us |",
           f"| re-armed slot: a fresh communicator over the same GPUs (its startup phase) | {s_.get('communicator_init_ms', float('nan')):.1f} ms |"]
except (OSError, ValueError, TypeError):
    pass
if os.path.exists(f"{out}/roll_times.txt"):
    r0, r1 = (float(x) for x in open(f"{out}/roll_times.txt").read().split())
    roll = json.load(open(f"{out}/roll.json")) if os.path.getsize(f"{out}/roll.json") else {}
    recs = [json.loads(l) for l in open(f"{out}/roll_load.jsonl") if l.strip()]
    before = [x for x in recs if x["end"] < r0]
    during = [x for x in recs if x["end"] >= r0 and x["start"] <= r1]
    after = [x for x in recs if x["start"] > r1]
    def lat(v):
        v = [1000 * (x["end"] - x["start"]) for x in v if x["ok"]]
        return (f"{pct(v, 50):.0f}", f"{pct(v, 99):.0f}") if v else ("-", "-")
    sa = json.load(open(f"{out}/status_after_roll.json"))
    versions = sorted(e.get("version", "") for e in sa["engines"])
    both_new = all("--max-batch" in v for v in versions)
    md += ["", f"| rolling upgrade under load (`wsup reload`, a flag added to the engine command) | measured |", "|---|---|",
           f"| outcome | {roll.get('outcome', '?')} |",
           f"| reload to both engines on the new version (ms; includes the watch window, supervisor.rollout_watch_ms) | {1000 * (r1 - r0):.0f} |",
           f"| both engines on the new version afterwards | {'yes' if both_new else 'no'} |"]
    for name, v in (("before the roll", before), ("during the roll", during), ("after the roll", after)):
        p50, p99 = lat(v)
        md += [f"| 32-token streams {name}: requests, not ok, latency p50 / p99 (ms) | {len(v)}, {sum(1 for x in v if not x['ok'])}, {p50} / {p99} |"]
open(f"{out}/node.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
