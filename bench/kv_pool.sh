#!/usr/bin/env bash
# The node's KV pool on a GPU, both ways in one run (bench/node.sh each
# time, the same model, probe and drills):
#   1. private: each engine allocates its own KV cache of POOL_MIB;
#   2. pool:    the node keeps one KV pool of POOL_MIB per rank, the active
#               engine maps it, the standby serves from a SCRATCH_MIB scratch;
#   3. full:    a pool of BIG_POOL_MIB on a GPU that another process fills
#               to about FULL_LEFT_GIB free before the node starts, so the
#               node's weights, pool and two engines leave it nearly full
#               (with private caches of that size the standby would not fit).
# Then one table side by side: nvidia-smi per process (the standby against a
# bare CUDA context), the whole GPU, and the crash drills: kill to swap, to
# the first correct answer, to the killed engine's exit, and to the promoted
# engine's full KV (the ledger's gone_ms and kv_full_ms).
#
#   bench/kv_pool.sh OUTDIR [BIN_DIR]   # DEVICE=cuda:0 POOL_MIB=2048 SCRATCH_MIB=64 BIG_POOL_MIB=65536
#                                       # FULL_LEFT_GIB=4 DRILLS=10 LOAD_SECS=5 DOC=docs/benchmarks.md
#                                       # ORDER=private-first|pool-first
# Writes OUTDIR/kv_pool.md and the section of DOC (default: none).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_args "usage: bench/kv_pool.sh OUTDIR [BIN_DIR]" "$@"
device=${DEVICE:-cuda:0}
dev=${device#cuda:}
pool_mib=${POOL_MIB:-2048}
scratch_mib=${SCRATCH_MIB:-64}
big_pool_mib=${BIG_POOL_MIB:-65536}
full_left_gib=${FULL_LEFT_GIB:-4}
export DEVICE="$device" DRILLS="${DRILLS:-10}" LOAD_SECS="${LOAD_SECS:-5}"

# ORDER=pool-first runs the pool node before the private one (the runs are
# sequential on one GPU; swapping them shows whether the order matters).
run_private() { KV_MIB="$pool_mib" KV_POOL_MIB=0 bash "$here/node.sh" "$out/private" "$bin" > "$out/private.log" 2>&1; }
run_pool() {
  KV_POOL_MIB="$pool_mib" SCRATCH_MIB="$scratch_mib" bash "$here/node.sh" "$out/pool" "$bin" > "$out/pool.log" 2>&1
}
if [ "${ORDER:-private-first}" = pool-first ]; then run_pool; run_private; else run_private; run_pool; fi
fill=0
if [ "$device" != cpu ] && [ "$big_pool_mib" != 0 ]; then
  # What the node needs besides the pool, from the pool run: the weights and
  # the two engines' own memory; the rest of the GPU is filled up to what
  # leaves FULL_LEFT_GIB free once the node runs.
  fill=$(python3 - "$out/pool/node.json" "$big_pool_mib" "$full_left_gib" "${dev%%,*}" <<'PY'
import json, subprocess, sys
j = json.load(open(sys.argv[1]))
big, left, dev = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
total = int(subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", dev],
                           capture_output=True, text=True).stdout.split()[0])
node = int(j["used_mib"]) - int(j["pool_mib"])  # weights, the engines' own memory, the rest
print(max(0, (total - node - big) // 1024 - left))
PY
)
  KV_POOL_MIB="$big_pool_mib" SCRATCH_MIB="$scratch_mib" FILL_GIB="$fill" bash "$here/node.sh" "$out/full" "$bin" \
    > "$out/full.log" 2>&1
fi

python3 - "$out" "$pool_mib" "$scratch_mib" "$big_pool_mib" "$fill" "$device" > "$out/kv_pool.md" <<'PY'
import json, os, sys, datetime, subprocess
out, pool_mib, scratch_mib, big_pool_mib, fill, device = sys.argv[1:]
runs = [("private", f"private KV {pool_mib} MiB each"), ("pool", f"pool {pool_mib} MiB"),
        ("full", f"pool {int(big_pool_mib) >> 10} GiB, GPU nearly full")]
runs = [(k, t, json.load(open(f"{out}/{k}/node.json"))) for k, t in runs if os.path.exists(f"{out}/{k}/node.json")]
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else None
def fmt(v):
    return "-" if v is None else str(v)
def mem(j, role):
    for e in j["engines"]:
        if e["role"] == role:
            for name, mib in j["apps"]:
                if name.startswith(f"engine {e['slot']} ("):
                    return mib
    return None
def kv(j, role):
    for e in j["engines"]:
        if e["role"] == role:
            k = e.get("kv") or {}
            return f"{k.get('source', '?')} {k.get('bytes', 0) >> 20} MiB" if k else "?"
    return "-"
def named(j, name):
    return next((mib for n, mib in j["apps"] if n == name), None)
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().splitlines() if device != "cpu" else []
head = "| | " + " | ".join(t for _, t, _ in runs) + " |"
sep = "|---|" + "---:|" * len(runs)
rows = []
def row(name, f):
    rows.append(f"| {name} | " + " | ".join(fmt(f(j)) for _, _, j in runs) + " |")
row("active engine: KV", lambda j: kv(j, "active"))
row("standby engine: KV", lambda j: kv(j, "standby"))
row("active engine, nvidia-smi (MiB)", lambda j: mem(j, "active"))
row("standby engine, nvidia-smi (MiB)", lambda j: mem(j, "standby"))
def other(j, role):
    for e in j["engines"]:
        if e["role"] == role and (e.get("memory") or {}).get("other_bytes") is not None:
            return e["memory"]["other_bytes"] >> 20
    return None
row("active engine: its own memory beyond its KV (MiB, /wsup/status memory.other_bytes)", lambda j: other(j, "active"))
row("standby engine: its own memory beyond its KV (MiB)", lambda j: other(j, "standby"))
row("holder, nvidia-smi (MiB; the weights and the pool are charged to no process)", lambda j: named(j, "holder"))
row("a bare CUDA context, nvidia-smi (MiB)", lambda j: j.get("bare_mib") or None)
row("standby above a bare context (MiB: its scratch, step buffers, graphs, kernels)",
    lambda j: (mem(j, "standby") - int(j["bare_mib"])) if mem(j, "standby") and j.get("bare_mib") else None)
def graphs(j, role):
    for e in j["engines"]:
        if e["role"] == role and (e.get("memory") or {}).get("graphs_bytes") is not None:
            return e["memory"]["graphs_bytes"] >> 20
    return None
row("standby engine: its decode graphs (MiB, captured at startup)", lambda j: graphs(j, "standby"))
def above_all(j):
    m, g = mem(j, "standby"), graphs(j, "standby")
    if not m or g is None or not j.get("bare_mib"):
        return None
    own_kv = int(j["pool_mib"]) and int(j.get("scratch_mib", 0)) or int(j["kv_mib"])
    return m - int(j["bare_mib"]) - g - own_kv
row("standby above its bare context, graphs and own KV (MiB; goal <= 1024)", above_all)
row("goal: the standby at most a parked Dynamo shadow's 2.7 GiB (2765 MiB)",
    lambda j: ("met" if mem(j, "standby") <= 2765 else "not met") if mem(j, "standby") else None)
row("another process holding GPU memory (GiB)", lambda j: j.get("fill_gib"))
row("whole GPU, memory.used (MiB)", lambda j: j["used_mib"])
row("of which the node besides the other process (MiB)",
    lambda j: int(j["used_mib"]) - sum(m for n, m in j["apps"] if n.startswith("pid ")) if j["used_mib"] else None)
for name, key in [("kill to swap", "swap"), ("kill to first correct answer", "first_ok"),
                  ("kill to the killed engine's exit", "gone"), ("kill to the promoted engine's full KV", "kv_full"),
                  ("the killed engine's exit to full KV (goal <= 5)", "kv_after_gone")]:
    row(f"{name}, p50 (ms)", lambda j, k=key: pct(j.get(k, []), 50))
    row(f"{name}, p99 (ms)", lambda j, k=key: pct(j.get(k, []), 99))
row("goal: full KV at most 5 ms after the exit, p99",
    lambda j: (("met" if pct(j["kv_after_gone"], 99) <= 5 else "not met") if j.get("kv_after_gone") else None))
# The promoted engine's mapping after each takeover (its log): fetched and
# imported ahead of the grant, so the grant only maps and grants access.
def parts(j, k, p):
    v = [x[k] for x in j.get("map_parts", []) if x["ahead"]]
    r = pct(v, p)
    return None if r is None else round(r, 2)
row("takeovers whose pool was fetched and imported ahead of the grant",
    lambda j: len([x for x in j.get("map_parts", []) if x["ahead"]]) if j.get("map_parts") else None)
for k, label in (("total", "the promoted engine: grant request to mapped"), ("import", "of which importing"),
                 ("map", "of which mapping"), ("access", "of which granting access")):
    row(f"{label}, p50 (ms)", lambda j, k=k: parts(j, k, 50))
    row(f"{label}, p99 (ms)", lambda j, k=k: parts(j, k, 99))
# Where the standby's own GPU memory went, by startup phase (NVML deltas).
def phase(j, name):
    for e in j["engines"]:
        if e["role"] == "standby":
            b = (e.get("memory") or {}).get("by_phase")
            return None if not b or name not in b else b[name] >> 20
    return None
for name, label in (("context", "its CUDA context and devices"), ("weights", "binding the weights (cuBLAS handle and workspace)"),
                    ("communicator", "the communicator"), ("kv_cache", "its KV scratch (or cache), step buffers, dequantization scratch"),
                    ("graph_capture", "capturing the decode graphs (with the kernels they load)"), ("warmup", "the warmup (kernels it loads)")):
    row(f"standby's own memory by startup phase: {label} (MiB)", lambda j, n=name: phase(j, n))
row("drills", lambda j: len(j["swap"]))
print(f"Machine: {gpu[0] if gpu else device}; {datetime.date.today().isoformat()}.")
print(f"Model: the generated 1.1B Llama of bench/node.sh (2.1 GiB of bf16), one holder (cuda VMM), "
      f"a primary and a standby `wsup-engine --device {device}`; the pool runs give each engine a scratch of "
      f"{scratch_mib} MiB; {os.environ.get('DRILLS', '10')} crash drills each (`wsup failover --drill --kill`) "
      f"after {os.environ.get('LOAD_SECS', '5')} s of streaming load.")
print()
print("```sh")
settings = " ".join(f"{k}={os.environ[k]}" for k in ("DRILLS", "LOAD_SECS", "ORDER", "BIG_POOL_MIB") if k in os.environ)
print(f"{settings + ' ' if settings else ''}bench/kv_pool.sh OUTDIR BIN_DIR   # runs bench/node.sh {len(runs)} times")
print("```")
print()
print("The pool and the weights are VMM memory the holder made; the driver charges them to no process (the holder")
print("keeps only their fds), so nvidia-smi's per-process figures are each engine's own memory and the whole GPU")
print("is one weight copy + one KV pool + the engines' own memory. Kill to full KV: from the SIGKILL to the")
print("promoted engine's answer that it mapped the pool (the ledger's kv_full_ms), which the supervisor asks for")
print("only once the killed engine's exit is seen (gone_ms).")
print()
print(head)
print(sep)
print("\n".join(rows))
PY
cat "$out/kv_pool.md"
if [ -n "${DOC:-}" ]; then
  python3 "$here/doc_section.py" "$DOC" "## The node's KV pool on the GPU (\`bench/kv_pool.sh\`)" "$out/kv_pool.md"
fi
