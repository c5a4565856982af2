// The reference tokenizer (Hugging Face tokenizers, the Rust library's Node
// bindings) over JSON lines {"hex": "..."} on stdin: one line
// {"ids": [...], "text": decode(ids)} each on stdout. Bytes that are not
// UTF-8 are decoded as a browser does (each maximal ill-formed subpart is
// U+FFFD), as a JSON client would have sent them.
//
// Usage: node reference.mjs TOKENIZER_JSON [--no-special] [--skip-special]
import { createInterface } from "node:readline";
import { Tokenizer } from "@anush008/tokenizers";

const [path, ...flags] = process.argv.slice(2);
const addSpecial = !flags.includes("--no-special");
const skipSpecial = flags.includes("--skip-special");
const tok = Tokenizer.fromFile(path);
const utf8 = new TextDecoder("utf-8");
const texts = [];
for await (const line of createInterface({ input: process.stdin })) {
  if (line) texts.push(utf8.decode(Buffer.from(JSON.parse(line).hex, "hex")));
}
// In batches: one call per string costs more in the bindings than the work.
const out = [];
for (let i = 0; i < texts.length; i += 1000) {
  const encs = await tok.encodeBatch(texts.slice(i, i + 1000), { addSpecialTokens: addSpecial });
  const ids = encs.map((e) => Array.from(e.getIds()));
  const decoded = await tok.decodeBatch(ids, skipSpecial);
  ids.forEach((v, k) => out.push(JSON.stringify({ ids: v, text: decoded[k] })));
}
process.stdout.write(out.join("\n") + "\n");
