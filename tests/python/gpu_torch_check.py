#!/usr/bin/env python3
"""The Python client on a GPU with torch and transformers (no pytest needed).

For each test model, in this order:
  1. starts `wsup-holder --backend cuda` on it, in a temporary directory;
  2. attaches from Python (mode daemon, fingerprint from the checkpoint
     folder) and checks every tensor: on cuda:DEVICE, the dtype and shape of
     tensors.json, its bytes' sha256, its address the arena's, and no memory
     taken from torch's allocator (torch.cuda.memory_allocated unchanged);
  3. builds LlamaForCausalLM from config.json on the meta device and binds
     it with wsup_client.bind_module: the parameters are the attached tensors
     (addresses compared), rotary inv_freq computed, memory_allocated grows
     by less than 1% of the weights;
  4. generate(do_sample=False) on the four golden cases: output_ids equal;
  5. SIGKILLs the holder while the model holds the tensors, then generates
     the four cases again.
llama-tiny-fp8-block is checked the same way, except that the engine
dequantizes its block-FP8 weights (weight x scale_inv per 128x128 block) to
float32 before binding: a copy, which memory_allocated shows and the table
reports; the FP8 tensors themselves are attached without a copy, and after
the holder's death they are dequantized again from the still-mapped arena.

Prints a PASS/FAIL table; exits 1 if anything failed.

  python3 tests/python/gpu_torch_check.py --holder BIN_DIR/wsup-holder \\
      --lib LIB_DIR/libwsup_client.so --testdata TESTDATA_DIR [--device 0]

--impl tiny uses tests/python/tiny_llama.py (plain torch) instead of
transformers, --impl both runs both; --backend host runs the same flow on a
host arena (no GPU; memory checks are then skipped).
"""

import argparse
import gc
import hashlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, HERE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from check_table import Table  # noqa: E402
import wsup_client as wc  # noqa: E402
from wsup_client.holder import start_holder  # noqa: E402

MODELS = ("llama-tiny-f32", "llama-tiny-fp8-block")
TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn",
                "float16": "float16"}



def sha_of(t):
    """sha256 of a tensor's raw bytes (copied to the host for hashing only)."""
    import torch
    raw = t.contiguous().view(torch.uint8) if t.dtype != torch.uint8 else t.contiguous()
    return hashlib.sha256(raw.cpu().numpy().tobytes()).hexdigest()


def build_model(impl, model_dir):
    """A Llama of the checkpoint's config, on the meta device."""
    import torch
    if impl == "tiny":
        from tiny_llama import TinyLlama, read_config
        return TinyLlama(read_config(os.path.join(model_dir, "config.json")), device="meta")
    from transformers import AutoConfig, LlamaForCausalLM
    config = AutoConfig.from_pretrained(model_dir)
    # The engine dequantizes block FP8 itself (see --help): build the plain model.
    if getattr(config, "quantization_config", None) is not None:
        try:
            delattr(config, "quantization_config")
        except AttributeError:
            config.quantization_config = None
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return model.eval()


def generate(impl, model, prompt_ids, n, device):
    import torch
    if impl == "tiny":
        return model.greedy(prompt_ids, n)
    ids = torch.tensor([prompt_ids], device=device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, num_beams=1)
    return out[0, len(prompt_ids):].tolist()


def run_goldens(table, label, impl, model, cases, device, when):
    ok = True
    for c in cases:
        got = generate(impl, model, c["prompt_ids"], len(c["output_ids"]), device)
        good = got == c["output_ids"]
        ok &= good
        if not good:
            table.add(label, "golden %r %s" % (c["prompt"], when), False, "got %s want %s" % (got, c["output_ids"]))
    table.add(label, "generate(do_sample=False) = golden output_ids, %d cases, %s" % (len(cases), when), ok)
    return ok


def check_model(table, args, name, impl):
    import torch
    model_dir = os.path.join(args.testdata, name)
    label = "%s [%s]" % (name, impl)
    with open(os.path.join(model_dir, "tensors.json")) as f:
        want = json.load(f)
    with open(os.path.join(model_dir, "golden.json")) as f:
        cases = json.load(f)["cases"]
    with open(os.path.join(model_dir, "config.json")) as f:
        qcfg = json.load(f).get("quantization_config") or {}
    cuda = args.backend == "cuda"
    device = torch.device("cuda", args.device) if cuda else torch.device("cpu")
    mem = (lambda: torch.cuda.memory_allocated(device)) if cuda else (lambda: 0)
    if cuda:
        torch.zeros(1, device=device)  # the engine's CUDA is up before it attaches
        torch.cuda.synchronize(device)

    with tempfile.TemporaryDirectory(prefix="wsup-gpu-py-") as tmp:
        h = start_holder(args.holder, model_dir, tmp, args=["--backend", args.backend, "--device", str(args.device)],
                         timeout_s=120)
        try:
            mem0 = mem()
            t0 = time.perf_counter()
            att = wc.attach(h.socket, "daemon", checkpoint_dir=model_dir, backend=args.backend, device=args.device,
                            library=args.lib)
            ts = att.tensors("torch")
            ms = (time.perf_counter() - t0) * 1000
            table.add(label, "attach from Python (%s)" % args.backend, att.from_holder and att.is_cuda == cuda,
                      "%d tensors, C++ attach %.1f ms, Python total %.1f ms" % (len(ts), att.attach_ms, ms))
            bad = []
            for n, w in want.items():
                t = ts.get(n)
                if t is None:
                    bad.append(n + ": absent")
                elif t.device != device:
                    bad.append("%s: on %s" % (n, t.device))
                elif str(t.dtype) != "torch." + TORCH_DTYPES.get(w["dtype"], w["dtype"]):
                    bad.append("%s: %s, want %s" % (n, t.dtype, w["dtype"]))
                elif list(t.shape) != w["shape"]:
                    bad.append("%s: shape %s, want %s" % (n, list(t.shape), w["shape"]))
                elif t.data_ptr() != att.data_ptr(n):
                    bad.append("%s: not the arena's memory" % n)
                elif sha_of(t) != w["sha256"]:
                    bad.append("%s: bytes differ (sha256)" % n)
            bad += ["%s: not in tensors.json" % n for n in ts if n not in want]
            table.add(label, "tensors: device, dtype, shape, sha256, address = arena", not bad,
                      "; ".join(bad[:4]) if bad else "%d tensors" % len(want))
            mem_attach = mem() - mem0
            table.add(label, "attach took no torch memory (memory_allocated)", not cuda or mem_attach == 0,
                      "%+d bytes" % mem_attach if cuda else "host run: not measured")

            weights = sum(att.info(n).nbytes for n in ts)
            bind_from = ts
            quantized = [n for n in ts if n + "_scale_inv" in ts]
            if quantized:
                block = tuple(qcfg.get("weight_block_size", (128, 128)))
                before = mem()
                bind_from = wc.dequantize_checkpoint(ts, block_size=block, dtype=torch.float32)
                copy = mem() - before
                table.add(label, "engine-side block dequantization (a copy)", True,
                          "%d FP8 weights x scale_inv per %dx%d block -> float32; other tensors bf16 -> float32; "
                          "%.2f MiB allocated" % (len(quantized), block[0], block[1], copy / 2 ** 20))
            model = build_model(impl, model_dir)
            before = mem()
            report = wc.bind_module(model, bind_from)
            bound_mem = mem() - before
            same = [n for n, p in model.named_parameters() if n in ts and p.data_ptr() == att.data_ptr(n)]
            if quantized:
                table.add(label, "bind_module", len(report.bound) == len(bind_from),
                          "%d bound, %d straight from the arena, materialized %s" %
                          (len(report.bound), len(same), ", ".join(report.materialized)))
            else:
                n_params = len(list(model.named_parameters()))
                table.add(label, "bind_module: every parameter is the attached tensor (no copy)",
                          len(same) == n_params and n_params > 0,
                          "%d of %d parameters; materialized %s" % (len(same), n_params,
                                                                    ", ".join(report.materialized)))
                table.add(label, "memory_allocated after binding < 1% of the weights", not cuda or
                          bound_mem < weights / 100, "%+d bytes for %d bytes of weights" % (bound_mem, weights)
                          if cuda else "host run: not measured")
            run_goldens(table, label, impl, model, cases, device, "holder alive")

            status = h.kill(signal.SIGKILL)
            table.add(label, "holder SIGKILLed while the model holds the tensors", status == -signal.SIGKILL,
                      "exit status %s" % status)
            att.close()
            del att, bind_from
            gc.collect()
            if quantized:
                again = wc.dequantize_checkpoint(ts, block_size=block, dtype=torch.float32)
                same_bytes = all(torch.equal(again[n], p) for n, p in model.state_dict().items() if n in again)
                table.add(label, "FP8 arena still readable after the holder's death (dequantized again, equal)",
                          same_bytes)
                del again
            run_goldens(table, label, impl, model, cases, device, "holder dead")
            del model, ts
            gc.collect()
        finally:
            h.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--holder", required=True, help="path of wsup-holder")
    ap.add_argument("--lib", help="path of libwsup_client.so (default: $WSUP_CLIENT_LIB, then the usual places)")
    ap.add_argument("--testdata", required=True, help="folder of the test checkpoints")
    ap.add_argument("--device", type=int, default=0, help="cuda ordinal (default 0)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "host"))
    ap.add_argument("--impl", default="transformers", choices=("transformers", "tiny", "both"))
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: %(default)s)")
    args = ap.parse_args()
    table = Table("model")
    try:
        import torch
        version = "torch %s" % torch.__version__
        if args.impl != "tiny":
            import transformers
            version += ", transformers %s" % transformers.__version__
        if args.backend == "cuda" and not torch.cuda.is_available():
            sys.exit("torch sees no CUDA device: run this on the GPU machine, or pass --backend host")
        torch.backends.cuda.matmul.allow_tf32 = False  # the goldens are float32
        torch.backends.cudnn.allow_tf32 = False
    except ImportError as e:
        sys.exit("needs torch (and transformers for --impl transformers): %s" % e)
    print("wsup_client %s, libwsup_client %s, %s" % (wc.__version__, wc.library_version(args.lib), version))
    impls = ("transformers", "tiny") if args.impl == "both" else (args.impl,)
    for name in [m for m in args.models.split(",") if m]:
        for impl in impls:
            try:
                check_model(table, args, name, impl)
            except Exception as e:  # noqa: BLE001 - report and go on with the next model
                table.add("%s [%s]" % (name, impl), "ran to the end", False, "%s: %s" % (type(e).__name__, e))
                traceback.print_exc()
    return table.finish()


if __name__ == "__main__":
    sys.exit(main())
