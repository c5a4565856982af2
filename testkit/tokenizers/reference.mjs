// The reference tokenizer (Hugging Face tokenizers, the Rust library's Node
// bindings) over JSON lines {"hex": "..."} on stdin: one line each on
// stdout, both ways of asking in one run (one load of the file):
//   {"special": {"ids": encode(s, special tokens), "text": decode(ids, keeping them)},
//    "plain":   {"ids": encode(s, none),           "text": decode(ids, skipping them)}}
// Bytes that are not UTF-8 are decoded as a browser does (each maximal
// ill-formed subpart is U+FFFD), as a JSON client would have sent them.
//
// Usage: node reference.mjs TOKENIZER_JSON
import { createInterface } from "node:readline";
import { Tokenizer } from "@anush008/tokenizers";

const [path] = process.argv.slice(2);
const tok = Tokenizer.fromFile(path);
const utf8 = new TextDecoder("utf-8");
const texts = [];
for await (const line of createInterface({ input: process.stdin })) {
  if (line) texts.push(utf8.decode(Buffer.from(JSON.parse(line).hex, "hex")));
}
// In batches: one call per string costs more in the bindings than the work.
async function run(batch, addSpecial, skipSpecial) {
  const encs = await tok.encodeBatch(batch, { addSpecialTokens: addSpecial });
  const ids = encs.map((e) => Array.from(e.getIds()));
  const decoded = await tok.decodeBatch(ids, skipSpecial);
  return ids.map((v, k) => ({ ids: v, text: decoded[k] }));
}
const out = [];
for (let i = 0; i < texts.length; i += 1000) {
  const batch = texts.slice(i, i + 1000);
  const special = await run(batch, true, false);
  const plain = await run(batch, false, true);
  special.forEach((v, k) => out.push(JSON.stringify({ special: v, plain: plain[k] })));
}
process.stdout.write(out.join("\n") + "\n");
