#!/usr/bin/env bash
# Attach of 20,000 tensors from Python beside the C++ client, in one run:
#   1. wsup-gen-checkpoint writes a synthetic checkpoint of TENSORS (20,000)
#      small bf16 tensors in SHARDS (8) safetensors files, TOTAL_BYTES
#      (160M) in all: what attach costs per tensor, not per byte;
#   2. bench/attach_python.py starts a wsup-holder on it (--backend), then,
#      on the holder's socket, RUNS fresh processes of each kind:
#        C++      wsup-bench-attach --socket: the C++ client's Attach(),
#                 connect to every tensor addressable;
#        Python   wsup_client.attach(), the manifest, every numpy array
#                 (host) or torch tensor (cuda), once with the manifest
#                 table (wsup_manifest_table, what the package uses) and
#                 once with the per-tensor calls (the package before it);
#   3. prints the table (medians and p90s), writes it to OUTDIR/python_attach.md
#      (raw runs in OUTDIR/python_attach.json) and replaces its section of
#      docs/benchmarks.md (DOC=path for another file, DOC=none for none).
#
#   bench/python_attach.sh OUTDIR [BIN_DIR] [--backend host|cuda]
#
# BIN_DIR (default build/bin) holds wsup-holder, wsup-bench-attach and
# wsup-gen-checkpoint; the library is BIN_DIR/../lib/libwsup_client.so.
# --backend cuda (or BACKEND=cuda) on a GPU machine: a cuda holder, torch
# tensors on cuda:DEVICE. Environment (defaults in brackets): BACKEND [host],
# DEVICE [0], RUNS [15], TENSORS [20000], SHARDS [8], TOTAL_BYTES [160M],
# PYTHON [python3 with numpy; torch for cuda], CKPT_DIR [OUTDIR/ckpt],
# removed at the end unless KEEP_CKPT=1.
set -euo pipefail
usage="usage: bench/python_attach.sh OUTDIR [BIN_DIR] [--backend host|cuda]"
backend=${BACKEND:-host}
pos=()
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) backend=${2:?$usage}; shift 2 ;;
    --backend=*) backend=${1#--backend=}; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) pos+=("$1"); shift ;;
  esac
done
out=${pos[0]:?$usage}
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "${pos[1]:-$repo/build/bin}" && pwd)
case "$backend" in host|cuda) ;; *) echo "python_attach.sh: --backend is host or cuda, not '$backend'" >&2; exit 1 ;; esac
device=${DEVICE:-0}
runs=${RUNS:-15}
tensors=${TENSORS:-20000}
shards=${SHARDS:-8}
total=${TOTAL_BYTES:-160M}
py=${PYTHON:-python3}
doc=${DOC:-$repo/docs/benchmarks.md}
lib=$(cd "$bin/../lib" 2>/dev/null && pwd)/libwsup_client.so
for p in wsup-holder wsup-bench-attach wsup-gen-checkpoint; do
  [ -x "$bin/$p" ] || { echo "python_attach.sh: $bin/$p is missing; build it (ninja -C build $p)" >&2; exit 1; }
done
[ -f "$lib" ] || { echo "python_attach.sh: $lib is missing; build it (ninja -C build wsup_client_shared)" >&2; exit 1; }
kind=numpy
[ "$backend" = cuda ] && kind=torch
"$py" -c "import $kind" 2>/dev/null || { echo "python_attach.sh: $py cannot import $kind; set PYTHON=" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
ckpt=${CKPT_DIR:-$out/ckpt}

rm -rf "$ckpt"
"$bin/wsup-gen-checkpoint" --out "$ckpt" --shards "$shards" --tensors "$tensors" --total-bytes "$total" |
  tee "$out/gen.txt"
"$py" "$repo/bench/attach_python.py" --holder "$bin/wsup-holder" --checkpoint "$ckpt" --backend "$backend" \
  --device "$device" --kind "$kind" --runs "$runs" --lib "$lib" --readers per-tensor,table \
  --cpp-bench "$bin/wsup-bench-attach" --out "$out/table.md" | tee "$out/run.txt"
mv "$out/table.json" "$out/python_attach.json"
if [ "${KEEP_CKPT:-0}" != 1 ]; then rm -rf "$ckpt"; fi

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
gpu=""
if [ "$backend" = cuda ]; then
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
fi
{
  echo "Machine: $cpu, $(nproc) CPUs${gpu:+, GPU $gpu}; load average at the end $(cut -d' ' -f1-3 /proc/loadavg);"
  echo "$backend holder on a generated checkpoint of $tensors bf16 tensors in $shards files ($total);"
  echo "Python $("$py" -c 'import platform; print(platform.python_version())'),"
  echo "$kind $("$py" -c "import $kind; print($kind.__version__)"); $(date -u +%Y-%m-%d)."
  echo
  echo '```sh'
  echo "RUNS=$runs TENSORS=$tensors SHARDS=$shards TOTAL_BYTES=$total bench/python_attach.sh OUTDIR BIN_DIR --backend $backend"
  echo '```'
  echo
  cat "$out/table.md"
  echo
  echo "The C++ row and \"attach() to every tensor addressable\" cover the same work: from connect to"
  echo "every tensor's address known. The rest of the Python total is making one numpy array or torch"
  echo "tensor per tensor, which has no C++ counterpart. The kinds of process alternate round by round,"
  echo "so a machine whose load drifts weighs on every column alike; compare columns within one run."
} > "$out/python_attach.md"
rm -f "$out/table.md"
cat "$out/python_attach.md"
if [ "$doc" != none ]; then
  python3 "$repo/bench/doc_section.py" "$doc" \
    "## Python client: attach of $tensors tensors beside the C++ client, $backend holder (\`bench/python_attach.sh\`)" \
    "$out/python_attach.md"
  echo "wrote the section to $doc"
fi
