#!/usr/bin/env bash
# The reference engine's CPU decode throughput, two builds side by side in
# one run (say the tree before and after a kernel change): for each model
# shape and batch size, tokens/s of each build, the median of ROUNDS runs
# taken in turn (base, new, base, new, ...) so that both see the same
# machine. Each run is wsup-bench-engine on --device cpu (the engine's own
# decode measurement, bench/engine.sh).
#
#   bench/cpu_decode.sh OUTDIR BASE_BIN_DIR NEW_BIN_DIR   # ROUNDS=3 BATCHES=1,8,32 DOC=none
#                                                         # BASE_NAME, NEW_NAME: what the table calls them
#
# Shapes (wsup-gen-llama, bf16): "tiny" is the test checkpoint's shape
# (hidden 256, 2 layers), "small" a wider one (hidden 1024, 4 layers).
# Prints the table and writes OUTDIR/cpu_decode.md; with DOC=path (for
# example docs/benchmarks.md) it also replaces its section there.
set -euo pipefail
out=${1:?usage: bench/cpu_decode.sh OUTDIR BASE_BIN_DIR NEW_BIN_DIR}
base=$(cd "${2:?the bin folder of the base build}" && pwd)
new=$(cd "${3:?the bin folder of the new build}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
rounds=${ROUNDS:-3}
batches=${BATCHES:-1,8,32}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for b in "$base" "$new"; do
  for exe in wsup-engine wsup-holder wsup-bench-engine wsup-gen-llama; do
    [ -x "$b/$exe" ] || { echo "cpu_decode: $b/$exe is missing; build it (cmake --build BUILD_DIR) or pass its bin folder" >&2; exit 2; }
  done
done

declare -A shapes=(
  [tiny]="--hidden 256 --layers 2 --heads 4 --kv-heads 2 --inter 576 --vocab 256 --shards 1"
  [small]="--hidden 1024 --layers 4 --heads 16 --kv-heads 4 --inter 2816 --vocab 4096 --shards 1"
)
: > "$out/runs.tsv"
for shape in tiny small; do
  model="$out/model-$shape"
  rm -rf "$model"
  # shellcheck disable=SC2086  # the shape is a list of flags
  "$new/wsup-gen-llama" --out "$model" ${shapes[$shape]} > "$out/gen-$shape.txt"
  for r in $(seq 1 "$rounds"); do
    for which in base new; do
      bin=$base
      [ "$which" = new ] && bin=$new
      run="$out/run-$shape-$which-$r"
      rm -rf "$run"
      "$bin/wsup-bench-engine" --bin-dir "$bin" --model "$model" --device cpu --out "$run" --batches "$batches" \
        --max-tokens 32 --kv-cache-mib 64 > "$run.log" 2>&1 ||
        { echo "cpu_decode: $which run $r on $shape failed; see $run.log" >&2; exit 1; }
      # The decode table's rows: | batch | tokens | wall | tokens/s | ...
      awk -v s="$shape" -v w="$which" -F'|' '/^\| [0-9]+ \| [0-9]+ \|/ {gsub(/ /, "", $2); gsub(/ /, "", $5); print s "\t" w "\t" $2 "\t" $5}' \
        "$run/engine.md" >> "$out/runs.tsv"
    done
  done
done

python3 - "$out" "$rounds" "${BASE_NAME:-$base}" "${NEW_NAME:-$new}" > "$out/cpu_decode.md" <<'PY'
import collections, datetime, os, statistics, subprocess, sys
out, rounds, base, new = sys.argv[1:]
runs = collections.defaultdict(list)
for line in open(f"{out}/runs.tsv"):
    shape, which, batch, tps = line.split("\t")
    runs[(shape, int(batch), which)].append(float(tps))
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p' | head -1"], capture_output=True, text=True).stdout.strip()
print(f"Machine: CPU {cpu or 'unknown'} ({os.cpu_count()} cores), no GPU; {datetime.date.today().isoformat()}.")
print(f"Command: `bench/cpu_decode.sh OUTDIR BASE_BIN NEW_BIN` (ROUNDS={rounds}); base: {base}; new: {new}.")
print("Median tokens/s of the engine's own decode measurement (32 tokens per request, greedy), both builds in turn.")
print()
print("| shape | batch | base (tokens/s) | new (tokens/s) | new / base |")
print("|---|---:|---:|---:|---:|")
for shape in ("tiny", "small"):
    for batch in sorted({b for (s, b, _) in runs if s == shape}):
        b = statistics.median(runs[(shape, batch, "base")])
        n = statistics.median(runs[(shape, batch, "new")])
        print(f"| {shape} | {batch} | {b:.0f} | {n:.0f} | {n / b:.2f} |")
PY
cat "$out/cpu_decode.md"
if [ "${DOC:-none}" != none ]; then
  python3 "$here/doc_section.py" "$DOC" "## Reference engine on the CPU: decode throughput, two builds side by side (\`bench/cpu_decode.sh\`)" "$out/cpu_decode.md"
fi
