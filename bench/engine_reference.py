#!/usr/bin/env python3
"""The reference beside wsup-engine in bench/engine.sh: transformers with
PyTorch's scaled-dot-product attention, bfloat16, on the same GPU, model and
prompts.

    bench/engine_reference.py MODEL_DIR OUT_JSON [--prefill 2048,8192] [--batches 1,8] [--max-tokens 128]

Prefill: a forward pass over the prompt with logits_to_keep=1 (what an
engine's prefill computes), best of two after a warm-up; the prompts are
wsup-bench-engine's (the same xorshift sequence of token ids). Decode: B
copies of wsup-bench-engine's prompt, then max_tokens greedy steps with the
KV cache; tokens/s over the steps' wall time.
"""
import argparse
import json
import sys
import time


def prompt_ids(n, vocab):
    # wsup-bench-engine's TimePrefill: xorshift32 from 2463534242.
    x, out = 2463534242, []
    for _ in range(n):
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        out.append(x % vocab)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--prefill", default="2048,8192")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        sys.exit(f"engine_reference: {e}; install torch and transformers to run the reference")

    dev = torch.device(a.device)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev)
    model.eval()
    vocab = model.config.vocab_size

    def timed(fn):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        r = fn()
        torch.cuda.synchronize(dev)
        return (time.perf_counter() - t0) * 1000.0, r

    res = {"torch": torch.__version__, "prefill": [], "decode": []}
    with torch.inference_mode():
        model(torch.tensor([prompt_ids(128, vocab)], device=dev), logits_to_keep=1)  # warm-up
        for n in [int(v) for v in a.prefill.split(",") if v]:
            ids = torch.tensor([prompt_ids(n, vocab)], device=dev)
            best = min(timed(lambda: model(ids, logits_to_keep=1))[0] for _ in range(2))
            res["prefill"].append({"tokens": n, "ms": best})
            print(f"transformers prefill {n}: {best:.1f} ms", flush=True)
        # wsup-bench-engine's decode prompt, as wsup-engine reads it for the
        # generated checkpoint, which has no tokenizer files (one token per
        # byte); engine.sh always generates the model it measures.
        text = list("The quick brown fox jumps over".encode())
        for b in [int(v) for v in a.batches.split(",") if v]:
            ids = torch.tensor([text] * b, device=dev)
            out = model(ids, use_cache=True, logits_to_keep=1)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)

            def decode():
                nonlocal cache, nxt
                for _ in range(a.max_tokens):
                    o = model(nxt, past_key_values=cache, use_cache=True)
                    cache, nxt = o.past_key_values, o.logits[:, -1:].argmax(-1)

            ms, _ = timed(decode)
            res["decode"].append({"batch": b, "tokens_per_s": b * a.max_tokens / (ms / 1000.0),
                                  "ms_per_step": ms / a.max_tokens})
            print(f"transformers decode batch {b}: {b * a.max_tokens / (ms / 1000.0):.1f} tokens/s", flush=True)
            del cache, out
            torch.cuda.empty_cache()
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
