#!/usr/bin/env bash
# The reference engine on a generated Llama checkpoint (bf16; by default
# about 1.1B parameters: hidden 2048, 16 layers, 32 heads, 8 KV heads,
# intermediate 8192, vocabulary 32000; pseudo-random weights, so the cost is
# real and the text is not), beside transformers with PyTorch's SDPA on the
# same GPU, model and prompts (bench/engine_reference.py):
#   - startup phases with weights from the holder and from disk;
#   - decode tokens/s at each batch size;
#   - prefill: time to first token and tokens/s at each prompt length;
#   - the floors: weight bytes over HBM bandwidth for a decode step, and the
#     prefill's matrix and attention FLOPs as a share of the bf16 tensor-core
#     peak (known for H100 and H200).
#
#   bench/engine.sh OUTDIR [BIN_DIR]     # DEVICE=cuda:0 by default
#   PREFILL=2048,8192,32768 BATCHES=1,8,32,128 MATMUL=split|bf16
#   GEN_ARGS="--hidden 4096 --layers 32 --inter 14336 --vocab 128256"   # about 8B
#   DOC=docs/benchmarks.md bench/engine.sh OUTDIR   # also writes its section there
#   DEVICE=cpu SIZE=small bench/engine.sh OUTDIR build/bin   # a quick CPU check
# Prints a table and writes it to OUTDIR/engine-table.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_args "usage: bench/engine.sh OUTDIR [BIN_DIR]" "$@"
bench_need wsup-engine wsup-holder wsup-gen-llama wsup-bench-engine
device=${DEVICE:-cuda:0}
model=${MODEL_DIR:-$out/model}
matmul=${MATMUL:-split}
if [ "${SIZE:-1b}" = small ]; then
  gen=(--hidden 256 --layers 2 --heads 4 --kv-heads 2 --inter 512 --vocab 512 --shards 2 --max-pos 4096)
  extra=(--max-tokens 32 --kv-cache-mib 256)
  prefill=${PREFILL:-256,1024}
  batches=${BATCHES:-1,8}
else
  # shellcheck disable=SC2206
  gen=(--max-pos 40960 ${GEN_ARGS:-})
  extra=(--max-tokens 128 --kv-cache-mib 16384)
  prefill=${PREFILL:-2048,8192,32768}
  batches=${BATCHES:-1,8,32,128}
fi
[ "$device" = cpu ] || extra+=(--engine-arg=--matmul "--engine-arg=$matmul")
rm -rf "$model"
"$bin/wsup-gen-llama" --out "$model" "${gen[@]}" | tee "$out/gen.txt"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
"$bin/wsup-bench-engine" --bin-dir "$bin" --model "$model" --device "$device" --out "$out" --batches "$batches" \
  --prefill "$prefill" "${extra[@]}"
ref=none
if [ "$device" != cpu ]; then
  if python3 -c 'import torch, transformers' 2>/dev/null; then
    python3 "$here/engine_reference.py" "$model" "$out/reference.json" --prefill "$prefill" --batches "$batches" \
      --max-tokens 128 --device "$device"
    ref=$out/reference.json
  else
    echo "engine.sh: torch or transformers is not importable here: the transformers column is left out" >&2
  fi
fi
python3 - "$out" "$model" "$ref" "${gpu%%,*}" > "$out/side.md" <<'PY'
import json, sys
out, model, ref, gpu = sys.argv[1:5]
cfg = json.load(open(f"{model}/config.json"))
eng = json.load(open(f"{out}/engine.json"))
rf = json.load(open(ref)) if ref != "none" else None
# HBM bandwidth (bytes/s) and dense bf16 tensor-core peak (FLOP/s), from the
# vendors' data sheets (SXM parts).
known = {"H200": (4.8e12, 989e12), "H100": (3.35e12, 989e12)}
bw, peak = next((v for k, v in known.items() if k in gpu), (None, None))
H, L, I = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
hd = cfg.get("head_dim") or H // nh
mat = L * (H * (nh * hd + 2 * nkv * hd) + nh * hd * H + 3 * H * I)
wbytes = eng["holder"]["weights"]["bytes"]
def flops(n):
    return 2 * mat * n + 4 * (n * (n + 1) // 2) * nh * hd * L
def table(head, ours, theirs, row):
    """One markdown table: a row per size we measured, the reference's beside it."""
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for size, mine in ours.items():
        print("| " + " | ".join(row(size, mine, theirs.get(size))) + " |")
def by(section, key, source):
    return {p[key]: p for p in (source or {}).get(section, [])}
def prefill_row(n, p, r):
    ms = p["ms"]
    share = f"{flops(n) / (ms / 1000) / peak * 100:.1f}%" if peak else "-"
    ref = [f"{r['ms']:.1f}", f"{n / (r['ms'] / 1000):,.0f}", f"{ms / r['ms']:.1f}x"] if r else ["-"] * 3
    return [f"{n:,}", f"{ms:.1f}", f"{n / (ms / 1000):,.0f}", share] + ref
def decode_row(b, d, r):
    use = f"{wbytes / (d['ms_per_step'] / 1000) / bw * 100:.0f}%" if bw else "-"
    ref = [f"{r['tokens_per_s']:.1f}", f"{d['tokens_per_s'] / r['tokens_per_s']:.2f}x"] if r else ["-"] * 2
    return [str(b), f"{d['tokens_per_s']:.1f}", f"{d['ms_per_step']:.2f}", use] + ref
print(f"Weights: {wbytes / 2**30:.2f} GiB; matrix parameters {mat / 1e9:.2f}B.")
table(["prefill, prompt tokens", "wsup-engine TTFT (ms)", "tokens/s", "of the bf16 peak", "transformers + SDPA (ms)",
       "tokens/s", "wsup-engine slower by"], by("prefill", "tokens", eng), by("prefill", "tokens", rf), prefill_row)
table(["decode, batch", "wsup-engine tokens/s", "ms per step", "weight reads of HBM bandwidth", "transformers tokens/s",
       "wsup-engine / transformers"], by("decode", "batch", eng), by("decode", "batch", rf), decode_row)
if bw:
    print()
    print(f"Floors on this GPU: a decode step reads {wbytes / 2**30:.2f} GiB of weights, {wbytes / bw * 1000:.2f} ms at "
          f"{bw / 1e12:.2f} TB/s; prefill of 8,192 tokens is {flops(8192) / 1e12:.1f} TFLOP, "
          f"{flops(8192) / peak * 1000:.1f} ms at the {peak / 1e12:.0f} TFLOP/s bf16 peak.")
if rf:
    print(f"transformers: torch {rf['torch']}, bfloat16, attn_implementation sdpa, eager decode with its KV cache.")
PY
{
  echo "Machine: ${gpu:-no GPU}; CPU: ${cpu:-unknown} ($(nproc) cores); device $device; $([ "$device" = cpu ] || echo "--matmul $matmul; ")$(date -u +%Y-%m-%d)"
  echo "Model: $(cat "$out/gen.txt")"
  echo
  cat "$out/side.md"
  echo
  cat "$out/engine.md"
} > "$out/engine-table.md"
echo
cat "$out/engine-table.md"
if [ -n "${DOC:-}" ]; then
  {
    echo "\`DEVICE=$device PREFILL=$prefill BATCHES=$batches MATMUL=$matmul${GEN_ARGS:+ GEN_ARGS=\"$GEN_ARGS\"} bench/engine.sh OUTDIR\`"
    echo
    cat "$out/engine-table.md"
  } > "$out/section.md"
  python3 "$here/doc_section.py" "$DOC" "## The reference engine beside transformers: a generated Llama of $(grep -o '[0-9.]* B parameters' "$out/gen.txt")" "$out/section.md"
fi
