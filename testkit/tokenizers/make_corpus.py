#!/usr/bin/env python3
"""The tokenizer exactness corpus: at least 10,000 strings, the same ones on
every run (a fixed seed), written as JSON lines {"hex": "..."} because some
are not UTF-8.

The kinds: ASCII prose, code, whitespace runs, digits, CJK, emoji,
combining marks and other scripts, the tokenizer's own added tokens written
in the text (whole, back to back, cut short), invalid UTF-8, and long mixes
of all of them.

Usage: make_corpus.py TOKENIZER_JSON OUT_JSONL [--per-kind N]
"""
import argparse
import json
import random

WORDS = ("the of and to in is was for on that with as by at from his her they have this which or an be are not "
         "but one all were can there would their we him been has when who will more no if out so said what up its "
         "about into than them could only other new some time these two may then do first any my now such like our "
         "over man me even most made after also did many before must through back years where much your way well "
         "down should because each just those people Mr how too little state good very make world still own see "
         "men work long get here between both life being under never day same another know while last might us "
         "great old year off come since against go came right used take three").split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'LL", "'D", "n't", "N'T"]
PUNCT = list(".,;:!?-()[]{}\"'/\\@#$%^&*_+=<>|~`")
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", "\u00a0", "\u3000", "\u2028",
          "\u2029", "\u0085", "\u180e", "\u2003", "\u200b", "\u000b", "\u000c", "        "]
CODE = [
    "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "{\"key\": [1, 2, 3], \"ok\": true}", "#include <vector>\n", "SELECT id, name FROM users WHERE id = 42;",
    "if x != None and y >= 0:\n        pass", "const fn = async () => { await fetch(url); };",
    "    \n\t\t  \n", "x=1;y=2;z=x+y", "<div class=\"a\">&nbsp;</div>", "fn main() { println!(\"{}\", 1); }",
    "a_b_c__d", "__init__", "0x1F3A; 0b1010; 1e-9; 3.14159", "// comment\n/* block */", "$ ls -la | grep .cc",
]


def rand_cp(rng, ranges):
    lo, hi = rng.choice(ranges)
    return chr(rng.randint(lo, hi))


def prose(rng):
    out = []
    for _ in range(rng.randint(1, 25)):
        w = rng.choice(WORDS)
        r = rng.random()
        if r < 0.1:
            w = w.capitalize()
        elif r < 0.13:
            w = w.upper()
        if rng.random() < 0.08:
            w += rng.choice(CONTRACTIONS)
        out.append(w)
        if rng.random() < 0.15:
            out.append(rng.choice(PUNCT))
    return rng.choice(["", " "]) + " ".join(out) + rng.choice(["", ".", "!", "?", "\n"])


def code(rng):
    return "".join(rng.choice(CODE) for _ in range(rng.randint(1, 4)))


def whitespace(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        parts.append(rng.choice(SPACES) * rng.randint(1, 4))
        if rng.random() < 0.6:
            parts.append(rng.choice(WORDS))
    return "".join(parts)


def digits(rng):
    parts = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.5:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 15))))
        elif r < 0.65:
            parts.append(f"{rng.random() * 10 ** rng.randint(0, 6):.{rng.randint(0, 5)}f}")
        elif r < 0.75:
            parts.append("".join(rng.choice("٠١٢٣٤٥٦٧٨٩") for _ in range(rng.randint(1, 6))))
        elif r < 0.85:
            parts.append("".join(rng.choice("０１２３４５６７８９") for _ in range(rng.randint(1, 6))))
        else:
            parts.append(rng.choice(["1,000,000", "12:30:45", "2024-01-31", "v1.2.3", "10%", "$9.99", "Ⅻ", "½"]))
        parts.append(rng.choice([" ", "", ", ", "\n", "x", "-"]))
    return "".join(parts)


CJK_RANGES = [(0x4E00, 0x9FA5), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3), (0x3400, 0x4DB5)]
CJK_PUNCT = list("。，、！？「」『』（）：；《》…・ー")


def from_ranges(rng, ranges, seqs, others, most, count):
    """count picks: a code point of `ranges`, else one of `seqs`, else one of `others`."""
    out = []
    for _ in range(rng.randint(1, count)):
        r = rng.random()
        if r < most:
            out.append(rand_cp(rng, ranges))
        elif r < most + (1 - most) * 0.5:
            out.append(rng.choice(seqs))
        else:
            out.append(rng.choice(others))
    return "".join(out)


def cjk(rng):
    return from_ranges(rng, CJK_RANGES, CJK_PUNCT, [" ", "abc", "123", "\n", " the "], 0.8, 30)


EMOJI_RANGES = [(0x1F600, 0x1F64F), (0x1F300, 0x1F5FF), (0x1F680, 0x1F6FF), (0x1F900, 0x1F9FF), (0x2600, 0x26FF)]
EMOJI_SEQ = ["👨‍👩‍👧‍👦", "👍🏽", "🇯🇵", "🏳️‍🌈", "❤️", "☺︎", "🧑🏿‍💻", "✌🏻", "1️⃣", "🤗"]


def emoji(rng):
    return from_ranges(rng, EMOJI_RANGES, EMOJI_SEQ, [" ", "ok ", "!", "\n"], 0.6, 12)


SCRIPTS = [(0x0900, 0x097F), (0x0E00, 0x0E7F), (0x0600, 0x06FF), (0x0590, 0x05FF), (0x0400, 0x04FF),
           (0x0370, 0x03FF), (0x10A0, 0x10FF), (0x0B80, 0x0BFF)]


def marks(rng):
    out = []
    for _ in range(rng.randint(1, 15)):
        r = rng.random()
        if r < 0.4:
            out.append(rng.choice("aeiouAEIOUnNcCsz") + "".join(chr(rng.randint(0x0300, 0x036F))
                                                                 for _ in range(rng.randint(1, 3))))
        elif r < 0.55:
            out.append(rng.choice(["é", "é", "Å", "Å", "ñ", "ñ", "ﬁ", "Ǆ", "ẛ̣", "한", "한"]))
        else:
            out.append(rand_cp(rng, SCRIPTS))
        if rng.random() < 0.3:
            out.append(" ")
    return "".join(out)


def special(rng, added):
    parts = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        t = rng.choice(added)
        if r < 0.5:
            parts.append(t)
        elif r < 0.65:
            parts.append(t[: rng.randint(1, max(1, len(t) - 1))])  # cut short
        elif r < 0.75:
            parts.append(t + t)
        else:
            parts.append(rng.choice([" ", "\n", "user", " hello ", "<", "|", ">", "<<", "||"]))
    return "".join(parts)


INVALID = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff", b"\xfe",
           b"\xc3", b"\xe4\xbd", b"\xf0\x9f\x98", b"\xf0\x9f", b"\xe2\x82", b"\xc2\x41", b"\xf8\x88\x80\x80\x80"]


def invalid(rng):
    out = b""
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.4:
            out += rng.choice(INVALID)
        elif r < 0.55:
            out += bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 6)))
        else:
            out += rng.choice([prose, cjk, emoji])(rng).encode()
    return out


def mixed(rng, added):
    kinds = [prose, code, whitespace, digits, cjk, emoji, marks]
    s = "".join(rng.choice(kinds)(rng) for _ in range(rng.randint(3, 20)))
    if rng.random() < 0.3:
        s += special(rng, added)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--per-kind", type=int, default=1000)
    a = ap.parse_args()
    with open(a.tokenizer, encoding="utf-8") as f:
        added = [t["content"] for t in json.load(f).get("added_tokens") or []] or ["<s>"]
    rng = random.Random(20261206)
    corpus = [b"", b" ", b"\n", b"a", "é".encode(), "🤗".encode(), b"\xff"]
    kinds = [prose, code, whitespace, digits, cjk, emoji, marks]
    for kind in kinds:
        corpus += [kind(rng).encode() for _ in range(a.per_kind)]
    corpus += [special(rng, added).encode() for _ in range(a.per_kind)]
    corpus += [invalid(rng) for _ in range(a.per_kind)]
    corpus += [mixed(rng, added).encode() for _ in range(a.per_kind)]
    with open(a.out, "w", encoding="ascii") as f:
        for s in corpus:
            f.write(json.dumps({"hex": s.hex()}) + "\n")
    print(f"{len(corpus)} strings")


if __name__ == "__main__":
    main()
