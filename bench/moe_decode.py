#!/usr/bin/env python3
"""Mixture-of-experts decode on the GPU: a generated Qwen3-MoE-style
checkpoint of realistic shape in block FP8 (pseudo-random weights, so every
step costs what a real model of that shape costs and the text is garbage),
served by wsup-engine on one GPU.

Measures, through wsup-bench-engine (bench/engine.cc): decode tokens/s at
batch 1 and 32, spawn to ready with weights from a cuda wsup-holder
(--weight-cache daemon) against from disk (--weight-cache off); and from
those the weight bandwidth achieved, the bytes of weights a decode step reads
over the step's time.

    bench/moe_decode.py OUTDIR [BIN_DIR]          # BIN_DIR: build/bin
    bench/moe_decode.py OUTDIR build/bin --small  # a quick shape, to check the script

Prints a markdown table, writes OUTDIR/moe_decode.md and replaces its section
of docs/benchmarks.md (--doc PATH for another file, --doc none for none).
Needs only Python 3 (the checkpoint is written without torch or numpy) and a GPU.
"""
import argparse
import datetime
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
HEADING = "## Mixture of experts on the GPU: decode and startup, Qwen3-MoE-style block FP8 (`bench/moe_decode.py`)"

# Qwen3-MoE-style (the 30B-A3B's widths, fewer experts and layers).
FULL = dict(hidden=2048, layers=16, heads=32, kv_heads=4, head_dim=128, experts=64, top_k=8, moe_inter=768,
            vocab=32000)
SMALL = dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, experts=8, top_k=2, moe_inter=128, vocab=512)
BLOCK = 128


def fail(msg):
    print("moe_decode.py: " + msg, file=sys.stderr)
    sys.exit(1)


def tensor_plan(s):
    """(name, dtype, shape) of every tensor, in file order."""
    H, hd = s["hidden"], s["head_dim"]
    out = [("model.embed_tokens.weight", "BF16", [s["vocab"], H])]

    def fp8(name, rows, cols):
        out.append((name, "F8_E4M3", [rows, cols]))
        out.append((name + "_scale_inv", "F32", [math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)]))

    for l in range(s["layers"]):
        p = "model.layers.%d." % l
        out.append((p + "input_layernorm.weight", "BF16", [H]))
        out.append((p + "post_attention_layernorm.weight", "BF16", [H]))
        fp8(p + "self_attn.q_proj.weight", s["heads"] * hd, H)
        fp8(p + "self_attn.k_proj.weight", s["kv_heads"] * hd, H)
        fp8(p + "self_attn.v_proj.weight", s["kv_heads"] * hd, H)
        fp8(p + "self_attn.o_proj.weight", H, s["heads"] * hd)
        out.append((p + "self_attn.q_norm.weight", "BF16", [hd]))
        out.append((p + "self_attn.k_norm.weight", "BF16", [hd]))
        out.append((p + "mlp.gate.weight", "BF16", [s["experts"], H]))
        for e in range(s["experts"]):
            q = p + "mlp.experts.%d." % e
            fp8(q + "gate_proj.weight", s["moe_inter"], H)
            fp8(q + "up_proj.weight", s["moe_inter"], H)
            fp8(q + "down_proj.weight", H, s["moe_inter"])
    out.append(("model.norm.weight", "BF16", [H]))
    out.append(("lm_head.weight", "BF16", [s["vocab"], H]))
    return out


WIDTH = {"BF16": 2, "F32": 4, "F8_E4M3": 1}


def nbytes(dtype, shape):
    return WIDTH[dtype] * math.prod(shape)


def generate(model_dir, s, shards):
    """Writes config.json, the shards and the index. Values: FP8 bytes with
    exponents well inside the finite range and block scales of 1/64
    (weights below 1/64 in magnitude), bf16 between 2^-9 and 2^-5 in
    magnitude (router and embeddings) or 1.0 (norms). One random pool,
    sliced at per-tensor offsets and mapped by byte tables, keeps generation
    at disk speed without numpy."""
    pool_n = 64 << 20
    # E4M3: sign, 4 exponent bits, 3 mantissa bits; exponents 1..6 only.
    fp8_table = bytes((b & 0x80) | ((1 + (b >> 3) % 6) << 3) | (b & 7) for b in range(256))
    fp8_pool = os.urandom(pool_n).translate(fp8_table)
    # bf16 little-endian: a random low byte (its top bit is the exponent's
    # lowest), a high byte of sign and exponent 2^-9 .. 2^-6.
    bf16_hi = bytes((b & 0x80) | (0x3B + (b >> 5) % 2) for b in range(256))
    bf16_pool = bytearray(os.urandom(pool_n))
    bf16_pool[1::2] = bytes(bf16_pool[1::2]).translate(bf16_hi)
    bf16_pool = bytes(bf16_pool)
    one_bf16, scale_f32 = struct.pack("<H", 0x3F80), struct.pack("<f", 1.0 / 64)

    def data(i, name, dtype, shape):
        n = math.prod(shape)
        if dtype == "F32":  # block scales
            return scale_f32 * n
        if dtype == "BF16" and name.endswith("norm.weight"):
            return one_bf16 * n
        pool = fp8_pool if dtype == "F8_E4M3" else bf16_pool
        want, parts = n * WIDTH[dtype], []
        at = (i * 7919 * WIDTH[dtype]) % len(pool)
        while want > 0:
            take = min(want, len(pool) - at)
            parts.append(pool[at:at + take])
            want -= take
            at = 0
        return b"".join(parts)

    if os.path.exists(model_dir):
        shutil.rmtree(model_dir)
    os.makedirs(model_dir)
    plan = tensor_plan(s)
    total = sum(nbytes(d, sh) for _, d, sh in plan)
    per_file = total / shards
    files, cur, cur_bytes = [], [], 0
    for t in plan:
        cur.append(t)
        cur_bytes += nbytes(t[1], t[2])
        if cur_bytes >= per_file and len(files) < shards - 1:
            files.append(cur)
            cur, cur_bytes = [], 0
    if cur:
        files.append(cur)
    weight_map = {}
    index = 0
    for k, tensors in enumerate(files):
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, len(files))
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, dtype, shape in tensors:
            n = nbytes(dtype, shape)
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        hj = json.dumps(header, separators=(",", ":")).encode()
        hj += b" " * ((-len(hj)) % 64)  # the data starts 64-byte aligned
        tmp = os.path.join(model_dir, fname + ".tmp")
        with open(tmp, "wb") as f:
            f.write(len(hj).to_bytes(8, "little"))
            f.write(hj)
            for name, dtype, shape in tensors:
                f.write(data(index, name, dtype, shape))
                index += 1
        os.replace(tmp, os.path.join(model_dir, fname))
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": s["hidden"],
        "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"], "intermediate_size": 4 * s["moe_inter"], "moe_intermediate_size": s["moe_inter"],
        "num_experts": s["experts"], "num_experts_per_tok": s["top_k"], "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": s["vocab"], "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu", "eos_token_id": None,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": [BLOCK, BLOCK]},
    }
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return plan, total, len(files)


def step_bytes(plan, s, batch):
    """Weight bytes one decode step of `batch` sequences reads, as stored:
    everything but the experts and the embedding (one row a token), plus
    the experts the step routes to. The routed count is the expectation for
    routing spread evenly over the experts (pseudo-random weights route
    that way): experts x (1 - (1 - top_k/experts)^batch) a layer."""
    dense, expert = 0, 0
    for name, dtype, shape in plan:
        n = nbytes(dtype, shape)
        if ".mlp.experts." in name:
            expert += n
        elif name == "model.embed_tokens.weight":
            dense += batch * WIDTH[dtype] * shape[1]
        else:
            dense += n
    per_expert = expert / (s["layers"] * s["experts"])
    used = s["experts"] * (1 - (1 - s["top_k"] / s["experts"]) ** batch)
    return dense + s["layers"] * used * per_expert, used


def parse_tables(md):
    ready = re.search(r"\*\*spawn to ready\*\*[^|]*\| \*\*([\d.]+)\*\* \| \*\*([\d.]+)\*\*", md)
    decode = {}
    for m in re.finditer(r"^\| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", md, re.M):
        decode[int(m.group(1))] = dict(tokens=int(m.group(2)), tok_s=float(m.group(4)), step_ms=float(m.group(5)),
                                       fwd_ms=float(m.group(6)))
    if not ready or not decode:
        fail("cannot read wsup-bench-engine's tables; see its output above")
    return float(ready.group(1)), float(ready.group(2)), decode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("bin_dir", nargs="?", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--model-dir", default="/tmp/wsup-bench-moe")
    ap.add_argument("--small", action="store_true", help="a tiny shape, to check the script end to end")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--kv-cache-mib", type=int, default=8192)
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "benchmarks.md"), help="PATH, or none")
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin_dir)
    for p in ("wsup-engine", "wsup-holder", "wsup-bench-engine"):
        if not os.access(os.path.join(bin_dir, p), os.X_OK):
            fail("%s/%s is missing; build it (cmake --build build --target %s)" % (bin_dir, p, p))
    gpu = ""
    if args.device.startswith("cuda"):
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        except (OSError, subprocess.TimeoutExpired) as e:
            fail("--device %s but nvidia-smi cannot run (%s); run this on the GPU machine" % (args.device, e))
        if not gpu:
            fail("--device %s but nvidia-smi lists no GPU; run this on the GPU machine" % args.device)
        gpu = gpu[0]
    outdir = os.path.abspath(args.outdir)
    os.makedirs(outdir, exist_ok=True)
    s = SMALL if args.small else FULL
    shards = 2 if args.small else 8
    print("generating %s ..." % args.model_dir, flush=True)
    plan, total, nfiles = generate(args.model_dir, s, shards)
    params = sum(math.prod(sh) for name, d, sh in plan if not name.endswith("_scale_inv"))
    size = "%.2f B parameters, %.2f GiB" % (params / 1e9, total / 2**30) if params >= 1e8 else \
        "%.2f M parameters, %.1f MiB" % (params / 1e6, total / 2**20)
    print("%s in %d files" % (size, nfiles), flush=True)

    eng_out = os.path.join(outdir, "engine")
    os.makedirs(eng_out, exist_ok=True)
    cmd = [os.path.join(bin_dir, "wsup-bench-engine"), "--bin-dir", bin_dir, "--model", args.model_dir, "--device",
           args.device, "--out", eng_out, "--batches", "1,32", "--max-tokens", str(args.max_tokens),
           "--kv-cache-mib", str(args.kv_cache_mib)]
    print(" ".join(cmd), flush=True)
    r = subprocess.run(cmd)
    if r.returncode != 0:
        fail("wsup-bench-engine exited %d; its logs are in %s" % (r.returncode, eng_out))
    with open(os.path.join(eng_out, "engine.md")) as f:
        engine_md = f.read()
    ready_holder, ready_disk, decode = parse_tables(engine_md)

    rows = []
    for b in sorted(decode):
        d = decode[b]
        nb, used = step_bytes(plan, s, b)
        rows.append("| %d | %.1f | %.2f | %.2f | %.1f | %.1f | %.1f |" % (
            b, d["tok_s"], d["step_ms"], d["fwd_ms"], used, nb / 2**20, nb / (d["fwd_ms"] / 1e3) / 1e9
            if d["fwd_ms"] > 0 else 0))
    cpu = ""
    try:
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    except OSError:
        pass
    shape = s
    body = "\n".join([
        "Machine: %s; CPU: %s (%d cores); device %s; %s." % (gpu or "no GPU", cpu or "unknown", os.cpu_count(),
                                                            args.device, datetime.date.today().isoformat()),
        "",
        "```sh",
        "bench/moe_decode.py OUTDIR build/bin%s   # generates %s" % (" --small" if args.small else "", args.model_dir),
        "```",
        "",
        ("Model: generated Qwen3-MoE-style (`Qwen3MoeForCausalLM`): hidden %d, %d layers, %d heads of %d "
         "(%d KV heads), %d experts of intermediate %d, top-%d, every layer sparse, vocabulary %d; "
         "attention and experts in block FP8 (128x128 scales), embeddings, router, norms and lm_head in bf16; "
         "%s in %d files, pseudo-random weights.") % (
            shape["hidden"], shape["layers"], shape["heads"], shape["head_dim"], shape["kv_heads"], shape["experts"],
            shape["moe_inter"], shape["top_k"], shape["vocab"], size, nfiles),
        "",
        "| weights from | spawn to ready (ms) |",
        "|---|---:|",
        "| %s holder (`--weight-cache daemon`) | %.0f |" % ("cuda" if gpu else "host", ready_holder),
        "| disk (`--weight-cache off`) | %.0f |" % ready_disk,
        "",
        "| decode, batch | tokens/s | ms per step | forward pass (ms) | experts read a layer | weight MiB a step | "
        "weight GB/s (over the forward pass) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ] + rows + [
        "",
        ("Weight bytes a step are counted as stored (FP8 bytes and their scales, bf16 elsewhere): all the "
         "non-expert weights, one embedding row a token, and the experts a step routes to, taken as the "
         "expectation for evenly spread routing (experts x (1 - (1 - top_k/experts)^batch) a layer). Above 8 "
         "tokens a step the non-expert products convert each matrix to float32 for cuBLAS, so they move more "
         "bytes than counted; the experts are read in FP8 by the expert kernel at every batch size."),
        "",
        "The engine's own phase table and logs: `OUTDIR/engine/engine.md`, `OUTDIR/engine/*.log`.",
    ])
    with open(os.path.join(outdir, "moe_decode.md"), "w") as f:
        f.write(body + "\n")
    print()
    print(engine_md)
    print(body)
    if args.doc != "none":
        subprocess.run([sys.executable, os.path.join(HERE, "doc_section.py"), args.doc, HEADING,
                        os.path.join(outdir, "moe_decode.md")], check=True)
        print("wrote the section to %s" % args.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
