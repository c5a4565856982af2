#!/usr/bin/env bash
# The reference engine's startup phases (weights from the holder versus from
# disk) and decode throughput at batch 1 and 32, on a generated Llama
# checkpoint of about 1.1B parameters (bf16; hidden 2048, 16 layers, 32 heads,
# 8 KV heads, intermediate 8192, vocabulary 32000; pseudo-random weights, so
# the cost is real and the text is not).
#
#   bench/engine.sh OUTDIR [BIN_DIR]          # DEVICE=cuda:0 by default
#   DEVICE=cpu SIZE=small bench/engine.sh OUTDIR build/bin   # a quick CPU check
# Prints a table and writes it to OUTDIR/engine.md.
set -euo pipefail
out=${1:?usage: bench/engine.sh OUTDIR [BIN_DIR]}
bin=${2:-build/bin}
device=${DEVICE:-cuda:0}
model=${MODEL_DIR:-/tmp/wsup-bench-llama}
mkdir -p "$out"
if [ "${SIZE:-1b}" = small ]; then
  gen=(--hidden 256 --layers 2 --heads 4 --kv-heads 2 --inter 512 --vocab 512 --shards 2)
  extra=(--max-tokens 32 --kv-cache-mib 64)
else
  gen=()
  extra=(--max-tokens 128 --kv-cache-mib 8192)
fi
rm -rf "$model"
"$bin/wsup-gen-llama" --out "$model" "${gen[@]}" | tee "$out/gen.txt"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
{
  echo "Machine: ${gpu:-no GPU}; CPU: ${cpu:-unknown} ($(nproc) cores); device $device; $(date -u +%Y-%m-%d)"
  echo "Model: $(cat "$out/gen.txt")"
  echo
} > "$out/header.md"
"$bin/wsup-bench-engine" --bin-dir "$bin" --model "$model" --device "$device" --out "$out" --batches 1,32 "${extra[@]}"
cat "$out/header.md" "$out/engine.md" > "$out/engine-table.md"
echo
cat "$out/engine-table.md"
