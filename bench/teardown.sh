#!/usr/bin/env bash
# A SIGKILLed process's teardown on the GPU, by the memory it held
# (bench/teardown.cc says what each mode holds and what is timed): the
# supervisor's lifeline sees an engine's death only once the kernel and the
# driver have torn its memory down. Three tables per size: the child idle at
# the kill, the child keeping the GPU busy writing its memory, and busy with
# another process holding the shared allocation imported (a standby that
# prepared the KV pool ahead of its grant).
#
#   bench/teardown.sh OUTDIR [BIN_DIR]   # DEVICE=0 SIZES="2048 65536" RUNS=10 DOC=docs/benchmarks.md
# Prints the tables and writes them to OUTDIR/teardown.md (and the section of DOC).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_args "usage: bench/teardown.sh OUTDIR [BIN_DIR]" "$@"
bench_need wsup-bench-teardown
device=${DEVICE:-0}
sizes=${SIZES:-2048 65536}
runs=${RUNS:-10}
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i "$device" 2>/dev/null || echo "unknown GPU")
{
  echo "Machine: $gpu; $(date -u +%Y-%m-%d)."
  echo
  echo '```sh'
  echo "bench/teardown.sh OUTDIR BIN_DIR   # SIZES=\"$sizes\" RUNS=$runs"
  echo '```'
  echo
  echo "Milliseconds from the SIGKILL; median (min..max) of $runs kills per mode, the modes interleaved."
  for size in $sizes; do
    for busy in "" --busy; do
      echo
      "$bin/wsup-bench-teardown" --device "$device" --size-mib "$size" --runs "$runs" $busy
    done
    # A standby that prepared the pool holds it imported while the active dies.
    echo
    "$bin/wsup-bench-teardown" --device "$device" --size-mib "$size" --runs "$runs" --busy --sibling \
      --modes import_keep,scratch_import
  done
} | tee "$out/teardown.md"
python3 "$here/doc_section.py" "$doc" "## A killed process's teardown by the GPU memory it held (\`bench/teardown.sh\`)" "$out/teardown.md"
