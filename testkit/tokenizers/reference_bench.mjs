// The reference tokenizer's speed on a corpus of JSON lines {"hex": "..."}:
// its load time (median of LOADS loads) and its encode throughput over
// ROUNDS passes, in batches of 1000, with the special tokens. Prints one
// JSON object. Run it on one core with TOKENIZERS_PARALLELISM=false (the
// library's own switch for its thread pool), as bench/tokenize.sh does.
//
// Usage: node reference_bench.mjs TOKENIZER_JSON CORPUS_JSONL ROUNDS LOADS
import { readFileSync } from "node:fs";
import { Tokenizer } from "@anush008/tokenizers";

const [path, corpus, rounds, loads] = process.argv.slice(2);
const loadMs = [];
let tok;
for (let i = 0; i < Number(loads); i++) {
  const t0 = performance.now();
  tok = Tokenizer.fromFile(path);
  loadMs.push(performance.now() - t0);
}
loadMs.sort((a, b) => a - b);
const utf8 = new TextDecoder("utf-8");
const texts = readFileSync(corpus, "utf8")
  .split("\n")
  .filter(Boolean)
  .map((l) => utf8.decode(Buffer.from(JSON.parse(l).hex, "hex")));
let bytes = 0;
let tokens = 0;
const t1 = performance.now();
for (let r = 0; r < Number(rounds); r++) {
  for (let i = 0; i < texts.length; i += 1000) {
    const encs = await tok.encodeBatch(texts.slice(i, i + 1000), { addSpecialTokens: true });
    for (const e of encs) tokens += e.getIds().length;
  }
}
const seconds = (performance.now() - t1) / 1000;
for (const s of texts) bytes += Buffer.byteLength(s) * Number(rounds);
console.log(JSON.stringify({ load_ms: loadMs[Math.floor(loadMs.length / 2)], bytes, tokens, seconds,
  mb_per_s: bytes / 1e6 / seconds }));
