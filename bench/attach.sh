#!/usr/bin/env bash
# Production-scale load and attach benchmark of the weight holder's arena, on
# a node with a CUDA GPU. In one run:
#   1. writes a synthetic checkpoint of 161 shard files and 20,000 bf16
#      tensors (DISK_BYTES on disk, default 40G: what the node's disk holds);
#   2. drops the page cache and reads every file with `dd iflag=direct`
#      (the disk's O_DIRECT ceiling);
#   3. drops the page cache again and cold-loads the same files into a CUDA
#      VMM arena (GB/s, peak RSS), then, in fresh processes, attaches the 20,000
#      tensors through the arena's fds versus one cuIpcOpenMemHandle each;
#   4. attaches a 96 GiB arena of 20,000 tensors synthesized in GPU memory
#      (not read from disk; it shows the attach cost at full resident size).
# Prints a table and writes it to OUTDIR/attach.md (with the raw JSON beside it).
#
#   bench/attach.sh OUTDIR [BIN_DIR]
set -euo pipefail
out=${1:?usage: bench/attach.sh OUTDIR [BIN_DIR]}
bin=${2:-build-release/bin}
disk=${DISK_BYTES:-40G}
ckpt=${CKPT_DIR:-/tmp/wsup-bench-ckpt}
mkdir -p "$out"

drop_caches() { sync; if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi; }

rm -rf "$ckpt"
"$bin/wsup-gen-checkpoint" --out "$ckpt" --shards 161 --tensors 20000 --total-bytes "$disk" | tee "$out/gen.txt"

drop_caches
start=$(date +%s.%N)
for f in "$ckpt"/*.safetensors; do dd if="$f" of=/dev/null bs=64M iflag=direct status=none; done
end=$(date +%s.%N)
bytes=$(du -cb "$ckpt"/*.safetensors | tail -1 | cut -f1)
dd_gbps=$(python3 -c "print(f'{$bytes/($end-$start)/1e9:.3f}')")
echo "dd O_DIRECT: $bytes bytes in $(python3 -c "print(f'{$end-$start:.2f}')") s = $dd_gbps GB/s"

drop_caches
"$bin/wsup-bench-attach" --checkpoint "$ckpt" --backend cuda --json | tee "$out/load.txt"
tail -1 "$out/load.txt" > "$out/load.json"
"$bin/wsup-bench-attach" --synthetic 20000 --total-bytes 96G --backend cuda --json | tee "$out/synthetic.txt"
tail -1 "$out/synthetic.txt" > "$out/synthetic.json"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo unknown)

python3 - "$out" "$dd_gbps" "$gpu" <<'PY'
import json, sys, datetime
out, dd, gpu = sys.argv[1], float(sys.argv[2]), sys.argv[3]
L = json.load(open(f"{out}/load.json")); S = json.load(open(f"{out}/synthetic.json"))
gib = lambda b: b / 2**30
rows = [
 ("checkpoint on disk", f"161 files, {L['tensors']} tensors, {gib(L['bytes_read']):.1f} GiB read from disk"),
 ("dd iflag=direct, same files", f"{dd:.2f} GB/s"),
 ("cold load into the CUDA arena", f"{L['load_gbps']:.2f} GB/s = {100*L['load_gbps']/dd:.0f}% of dd; {L['allocations']} allocation(s)"),
 ("  peak RSS of the loader", f"{L['peak_rss_bytes']/2**20:.0f} MiB (staging peak {L['peak_staging_bytes']/2**20:.0f} MiB)"),
 ("attach via fds, fresh process", f"{L['fd_attach_ms']:.1f} ms for {L['tensors']} tensors"),
 ("attach via cuIpcOpenMemHandle per tensor", f"{L.get('ipc_attach_ms', float('nan')):.1f} ms"),
 ("  ratio", f"{L.get('ipc_attach_ms', 0)/L['fd_attach_ms']:.0f}x"),
 ("96 GiB arena (synthesized in GPU memory)", f"{S['tensors']} tensors, {S['allocations']} allocation(s)"),
 ("  attach via fds, fresh process", f"{S['fd_attach_ms']:.1f} ms (parse {S['fd_attach_breakdown']['json_parse_ms']:.1f} ms, map {S['fd_attach_breakdown']['map_ms']:.1f} ms)"),
 ("  attach via cuIpcOpenMemHandle per tensor", f"{S.get('ipc_attach_ms', float('nan')):.1f} ms ({S.get('ipc_attach_ms', 0)/S['fd_attach_ms']:.0f}x)"),
]
md = [f"GPU: {gpu}; {datetime.date.today().isoformat()}", "", "| what | measured |", "|---|---|"]
md += [f"| {a} | {b} |" for a, b in rows]
open(f"{out}/attach.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
