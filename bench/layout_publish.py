#!/usr/bin/env python3
"""Engine-made layouts at scale on a GPU: publishing a model through the
holder against a plain from_pretrained, and attaching the published layout.

    python3 bench/layout_publish.py OUTDIR BIN_DIR [--gib 20] [--runs 3] [--device 0]

1. Generates a Llama-shaped checkpoint of about --gib GiB in bf16 under
   OUTDIR/model (random weights made on the GPU, save_pretrained), once; a
   folder already there with the same shape is reused. Its files are read
   once so that every load below finds them in the page cache alike.
2. Round by round (--runs), each in a fresh process, alternating:
   - plain: LlamaForCausalLM.from_pretrained(device_map=cuda:D), timed from
     the call to its return (the CUDA context is made before the clock);
   - publish: a new `wsup-holder --layout engine --backend cuda`; the
     process takes the lease, loads with the same call inside
     pub.torch_pool() (the loader writes straight into the holder's VMM
     grants) and commits model.state_dict(); timed from wsup_client.publish
     to the commit's return, with the load and the commit apart;
   - attach: another fresh process attaches the committed layout, builds the
     model on the meta device and binds it (wsup_client.bind_module); timed
     from attach to bound, plus torch.cuda.memory_allocated's growth.
3. Prints a table (median and min of the rounds) and writes it as a section
   of docs/benchmarks.md, with the command, the machine and the date.

The goal of issue 13: publish at most 1.05x the plain load.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "client", "python"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ENGINE = {"name": "bench-layout-publish", "version": "1", "transform": "transformers-bf16"}
HEADING = "## Engine-made layouts on cuda: publish against from_pretrained, and attach (`bench/layout_publish.py`)"


def shape_for(gib):
    # Llama-3-8B-like layers (hidden 4096, GQA 32/8, MLP 14336), as many as
    # the size asks: about 0.43 GiB of bf16 per layer, plus the embeddings.
    per_layer = (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336) * 2
    embed = 2 * 32000 * 4096 * 2
    layers = max(1, int(round((gib * 2**30 - embed) / per_layer)))
    return dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False,
                torch_dtype="bfloat16")


def generate(model_dir, gib, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    want = shape_for(gib)
    cfg_path = os.path.join(model_dir, "config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path) as f:
            have = json.load(f)
        if all(have.get(k) == v for k, v in want.items() if k != "torch_dtype"):
            return "reused"
    config = LlamaConfig(**want)
    torch.manual_seed(0)
    with torch.device("cuda:%d" % device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir, max_shard_size="5GB")
    del model
    torch.cuda.empty_cache()
    return "generated"


def warm(model_dir):
    total = 0
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            with open(os.path.join(model_dir, name), "rb") as f:
                while True:
                    b = f.read(64 << 20)
                    if not b:
                        break
                    total += len(b)
    return total


def role(args):
    import torch
    dev = "cuda:%d" % args.device
    torch.zeros(1, device=dev)  # the CUDA context, before any clock
    torch.cuda.synchronize()
    from transformers import AutoConfig, LlamaForCausalLM
    import wsup_client as wc
    out = {}
    if args.role == "plain":
        t0 = time.perf_counter()
        model = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map=dev)
        torch.cuda.synchronize()
        out["load_ms"] = (time.perf_counter() - t0) * 1000
        out["bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    elif args.role == "publish":
        t0 = time.perf_counter()
        pub = wc.publish(args.socket, "daemon", checkpoint_dir=args.model, engine=ENGINE, backend="cuda",
                         device=args.device, library=args.lib, client_name="bench-writer")
        if not pub.has_lease:
            raise SystemExit("publish: no lease (%s)" % pub.reason)
        t1 = time.perf_counter()
        with pub.torch_pool():
            model = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map=dev)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        granted, used, blocks = pub.usage()
        att = pub.commit(model.state_dict())
        t3 = time.perf_counter()
        out.update(lease_ms=(t1 - t0) * 1000, load_ms=(t2 - t1) * 1000, commit_ms=(t3 - t2) * 1000,
                   total_ms=(t3 - t0) * 1000, granted=granted, used=used, copied=len(att.report.copied),
                   commit_prepare_ms=att.report.prepare_ms, commit_sync_ms=att.report.sync_ms,
                   commit_holder_ms=att.report.holder_ms, grant_ms=att.report.grant_ms,
                   in_place=len(att.report.in_place), tensors=len(att.names()))
    else:
        mem0 = torch.cuda.memory_allocated(args.device)
        t0 = time.perf_counter()
        att = wc.attach(args.socket, "daemon", checkpoint_dir=args.model, backend="cuda", device=args.device,
                        engine=ENGINE, library=args.lib, client_name="bench-reader")
        tensors = att.tensors("torch")
        t1 = time.perf_counter()
        config = AutoConfig.from_pretrained(args.model)
        with torch.device("meta"):
            model = LlamaForCausalLM(config).to(torch.bfloat16)  # the dtype the layout was written in
        wc.bind_module(model, tensors)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        out.update(attach_ms=(t1 - t0) * 1000, bind_ms=(t2 - t1) * 1000, total_ms=(t2 - t0) * 1000,
                   grew=torch.cuda.memory_allocated(args.device) - mem0, source=att.source, tensors=len(tensors))
    print("RESULT " + json.dumps(out), flush=True)


def child(args, role_name, socket=""):
    cmd = [sys.executable, os.path.abspath(__file__), args.outdir, args.bin_dir, "--role", role_name,
           "--model", args.model, "--device", str(args.device), "--socket", socket]
    if args.lib:
        cmd += ["--lib", args.lib]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit("%s failed (exit %d):\n%s\n%s" % (role_name, p.returncode, p.stdout[-3000:], p.stderr[-3000:]))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("bin_dir")
    ap.add_argument("--gib", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--lib", default="")
    ap.add_argument("--doc", default=os.path.join(REPO, "docs", "benchmarks.md"))
    ap.add_argument("--role", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="", help=argparse.SUPPRESS)
    ap.add_argument("--socket", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.lib:
        for cand in (os.path.join(args.bin_dir, "..", "lib", "libwsup_client.so"),):
            if os.path.exists(cand):
                args.lib = os.path.abspath(cand)
    if args.role:
        return role(args)
    try:
        import torch
        if not torch.cuda.is_available():
            raise ImportError("no CUDA device")
    except ImportError as e:
        print("SKIP: this benchmark needs torch with a CUDA device (%s)" % e)
        return 0
    from wsup_client.holder import start_holder
    os.makedirs(args.outdir, exist_ok=True)
    args.model = os.path.join(os.path.abspath(args.outdir), "model")
    t0 = time.perf_counter()
    how = generate(args.model, args.gib, args.device)
    gen_s = time.perf_counter() - t0
    size = warm(args.model)
    print("model: %s in %.0f s, %.2f GiB of safetensors (read once to warm the page cache)" % (how, gen_s,
                                                                                             size / 2**30))
    holder = os.path.join(args.bin_dir, "wsup-holder")
    plain, pubs, atts = [], [], []
    for r in range(args.runs):
        plain.append(child(args, "plain"))
        with tempfile.TemporaryDirectory(prefix="wsup-lp-") as tmp:
            h = start_holder(holder, None, tmp, args=["--layout", "engine", "--backend", "cuda", "--device",
                                                      str(args.device)], name="layouts", timeout_s=120)
            try:
                pubs.append(child(args, "publish", h.socket))
                atts.append(child(args, "attach", h.socket))
            finally:
                h.stop()
        print("round %d: plain %.0f ms, publish %.0f ms (load %.0f, commit %.0f), attach %.1f ms" %
              (r + 1, plain[-1]["load_ms"], pubs[-1]["total_ms"], pubs[-1]["load_ms"], pubs[-1]["commit_ms"],
               atts[-1]["total_ms"]), flush=True)
    gib = plain[0]["bytes"] / 2**30
    p_med = med([x["load_ms"] for x in plain])
    q_med = med([x["total_ms"] for x in pubs])
    ratio = q_med / p_med
    rows = [
        ("plain `from_pretrained(device_map=cuda)`", [x["load_ms"] for x in plain]),
        ("publish: lease", [x["lease_ms"] for x in pubs]),
        ("publish: `from_pretrained` inside `pub.torch_pool()`", [x["load_ms"] for x in pubs]),
        ("- of which the lease's grants (holder round trips, mappings)", [x["grant_ms"] for x in pubs]),
        ("publish: `commit(model.state_dict())`", [x["commit_ms"] for x in pubs]),
        ("- of which describing and placing the tensors", [x["commit_prepare_ms"] for x in pubs]),
        ("- of which the device's queued writes", [x["commit_sync_ms"] for x in pubs]),
        ("- of which the holder's commit and reply (`wsup_publish_commit`)", [x["commit_holder_ms"] for x in pubs]),
        ("publish, in all", [x["total_ms"] for x in pubs]),
        ("attach the layout (fresh process, every tensor as torch)", [x["attach_ms"] for x in atts]),
        ("attach + meta model + `bind_module`", [x["total_ms"] for x in atts]),
    ]
    gpu = torch.cuda.get_device_name(args.device)
    lines = [
        "Machine: %s, %d CPUs, GPU %s; torch %s; %s." % (platform.processor() or platform.machine(),
                                                       os.cpu_count(), gpu, torch.__version__,
                                                       time.strftime("%Y-%m-%d")),
        "Model: a generated Llama-shaped checkpoint, %d layers, %.2f GiB of bf16 weights, %d tensors, in the page "
        "cache; each figure a fresh process, %d rounds alternating." % (
            shape_for(args.gib)["num_hidden_layers"], gib, pubs[0]["tensors"], args.runs),
        "",
        "```sh",
        "python3 bench/layout_publish.py OUTDIR BIN_DIR --gib %g --runs %d" % (args.gib, args.runs),
        "```",
        "",
        "| what | median ms | min ms |",
        "|---|---:|---:|",
    ]
    for name, xs in rows:
        lines.append("| %s | %.1f | %.1f |" % (name, med(xs), min(xs)))
    lines += [
        "| publish / plain (medians) | %.3fx | |" % ratio,
        "| goal: publish at most 1.05x plain | %s | |" % ("met" if ratio <= 1.05 else "NOT met"),
        "",
        "Publish: %d tensors recorded in place, %d copied; %.2f GiB granted, %.2f GiB in use by torch's pool at "
        "the commit. Attach: `torch.cuda.memory_allocated` grew by %d bytes; source `%s`." % (
            pubs[0]["in_place"], pubs[0]["copied"], pubs[0]["granted"] / 2**30, pubs[0]["used"] / 2**30,
            atts[0]["grew"], atts[0]["source"]),
    ]
    body = "\n".join(lines)
    print()
    print(body)
    with open(os.path.join(args.outdir, "layout_publish.md"), "w") as f:
        f.write(body + "\n")
    subprocess.run([sys.executable, os.path.join(HERE, "doc_section.py"), args.doc, HEADING,
                    os.path.join(args.outdir, "layout_publish.md")], check=True)
    print("wrote the section to %s" % args.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
