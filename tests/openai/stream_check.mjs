// The official `openai` npm client against a wsup front: CLIENTS concurrent
// loops stream greedy completions of the golden cases until SIGTERM, and
// every stream must be complete (a finish_reason, then the end of the
// stream) and equal to the golden output. The client's own retries are off
// (maxRetries: 0), so any failure the front let through is seen here.
//
//   node stream_check.mjs --base-url http://127.0.0.1:PORT/v1 --golden golden.json
//        [--clients 8] [--model NAME] [--only chats|completions]
//
// Prints "progress OK BAD" after each completion and, at the end,
// "summary {json}"; exits 0 when every completion was correct, 1 otherwise.
// Driven by tests/openai/openai_test.cc, which kills engines meanwhile.
//
// A golden file of a real-tokenizer checkpoint (testdata/*-tok-tiny: its
// "completions" and "chats") makes the loops alternate text completions
// and chats (chat.completions.create), each checked against the text
// transformers decoded; only the cases whose greedy margin leaves no doubt
// (at least 1e-3) are asked.
import { readFileSync } from "node:fs";
import OpenAI from "openai";

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const baseURL = arg("base-url");
const goldenPath = arg("golden");
const clients = Number(arg("clients", "8"));
const model = arg("model", "llama-tiny-f32");
if (!baseURL || !goldenPath) {
  console.error("usage: node stream_check.mjs --base-url URL --golden golden.json [--clients N] [--model NAME]");
  process.exit(2);
}
const golden = JSON.parse(readFileSync(goldenPath, "utf8"));
const sure = (c) => c.margin >= 1e-3;
// One shape for both kinds of golden: prompt or messages, and the text.
const only = arg("only", "");  // "chats" or "completions": one kind of a real-tokenizer golden
const allCases = golden.cases
  ? golden.cases.map((c) => ({ prompt: c.prompt, output_ids: c.output_ids, text: c.output_text_latin1 }))
  : [
      ...golden.completions.filter(sure).map((c) => ({ prompt: c.prompt, output_ids: c.output_ids, text: c.output_text })),
      ...golden.chats.filter(sure).map((c) => ({ messages: c.messages, output_ids: c.output_ids, text: c.output_text })),
    ];
const cases = allCases.filter((c) => !only || (only === "chats") === Boolean(c.messages));
if (cases.length === 0) {
  console.error(`no cases of kind ${only} in ${goldenPath}`);
  process.exit(2);
}
const counts_chat = { chats: 0 };
const label = (c) => (c.messages ? `chat ending "${c.messages[c.messages.length - 1].content}"` : `"${c.prompt}"`);
const client = new OpenAI({ baseURL, apiKey: "not-needed", maxRetries: 0, timeout: 60_000 });

let stopping = false;
const counts = { ok: 0, bad: 0, streams: 0, plain: 0 };
const failures = [];
process.on("SIGTERM", () => { stopping = true; });

function record(ok, what) {
  if (ok) counts.ok++;
  else {
    counts.bad++;
    if (failures.length < 20) failures.push(what);
  }
  console.log(`progress ${counts.ok} ${counts.bad}`);
}

// One streamed completion or chat: complete and equal to the golden text.
async function streamOnce(c) {
  const common = { model, max_tokens: c.output_ids.length, temperature: 0, stream: true };
  const stream = c.messages
    ? await client.chat.completions.create({ ...common, messages: c.messages })
    : await client.completions.create({ ...common, prompt: c.prompt });
  let text = "";
  let finish = null;
  let afterFinish = 0;
  for await (const chunk of stream) {
    const choice = chunk.choices?.[0];
    if (!choice) continue;
    if (finish !== null) afterFinish++;
    text += (c.messages ? choice.delta?.content : choice.text) ?? "";
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  counts.streams++;
  if (c.messages) counts_chat.chats++;
  if (finish === null) return `stream of ${label(c)} ended without a finish_reason after ${text.length} characters`;
  if (afterFinish > 0) return `stream of ${label(c)} went on after its finish_reason`;
  if (text !== c.text) {
    return `stream of ${label(c)} differs from the golden output: ${JSON.stringify(text)} vs ${JSON.stringify(c.text)}`;
  }
  return null;
}

// One plain completion or chat, the same check.
async function plainOnce(c) {
  const common = { model, max_tokens: c.output_ids.length, temperature: 0 };
  const r = c.messages
    ? await client.chat.completions.create({ ...common, messages: c.messages })
    : await client.completions.create({ ...common, prompt: c.prompt });
  counts.plain++;
  if (c.messages) counts_chat.chats++;
  const text = c.messages ? r.choices?.[0]?.message?.content : r.choices?.[0]?.text;
  if (text !== c.text) return `answer to ${label(c)} differs from the golden output: ${JSON.stringify(text)}`;
  return null;
}

async function loop(id) {
  for (let n = 0; !stopping; n++) {
    const c = cases[(id + n) % cases.length];
    const plain = id === 1 && n % 4 === 0;  // mostly streams; some plain answers too
    try {
      const why = plain ? await plainOnce(c) : await streamOnce(c);
      record(why === null, why);
    } catch (e) {
      record(false, `${plain ? "answer" : "stream"} of ${label(c)} threw ${e?.constructor?.name}: ${e?.message}`);
    }
  }
}

await Promise.all(Array.from({ length: clients }, (_, i) => loop(i)));
console.log(`summary ${JSON.stringify({ ...counts, ...counts_chat, failures })}`);
process.exit(counts.bad === 0 && counts.ok > 0 ? 0 : 1);
