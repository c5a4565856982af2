#include "engine/tokenizer.h"

#include "common/fs.h"
#include "text/checkpoint_text.h"
#include "text/utf8.h"

namespace wsup::engine {

std::vector<int32_t> EncodeBytes(std::string_view text) {
  std::vector<int32_t> out;
  out.reserve(text.size());
  for (unsigned char c : text) out.push_back(c);
  return out;
}

void AppendTokenText(int32_t token, std::string* out) {
  auto cp = static_cast<uint32_t>(token);
  if (token < 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) cp = 0xfffd;
  text::AppendUtf8(cp, out);
}

std::string DecodeTokens(const std::vector<int32_t>& tokens) {
  std::string out;
  for (int32_t t : tokens) AppendTokenText(t, &out);
  return out;
}

namespace {

class ByteText final : public TokenText {
 public:
  std::string Add(int32_t id) override {
    std::string s;
    AppendTokenText(id, &s);
    return s;
  }
  std::string Finish() override { return {}; }
  void Prime(const std::vector<int32_t>&) override {}  // every id is a whole character
};

class ByteCodec final : public TextCodec {
 public:
  std::vector<int32_t> Encode(std::string_view text, bool) const override { return EncodeBytes(text); }
  std::string Decode(const std::vector<int32_t>& ids, bool) const override { return DecodeTokens(ids); }
  std::unique_ptr<TokenText> Stream(bool) const override { return std::make_unique<ByteText>(); }
  const char* kind() const override { return "bytes"; }
  std::string Describe() const override { return "bytes: one token per UTF-8 byte (the checkpoint has no tokenizer.json)"; }
  int64_t size() const override { return 256; }
  Result<std::string> RenderChat(const nlohmann::ordered_json&, bool, const nlohmann::ordered_json&) const override {
    return Error(Code::kRefused, "the model has no tokenizer of its own (no tokenizer.json) and so no chat template; "
                                 "send a completion with a prompt instead");
  }
};

class FileText final : public TokenText {
 public:
  FileText(const text::Tokenizer& t, bool skip) : d_(t, skip) {}
  std::string Add(int32_t id) override { return d_.Add(id); }
  std::string Finish() override { return d_.Finish(); }
  void Prime(const std::vector<int32_t>& context) override { d_.Prime(context); }

 private:
  text::StreamDecoder d_;
};

class FileCodec final : public TextCodec {
 public:
  explicit FileCodec(std::unique_ptr<text::CheckpointText> t) : t_(std::move(t)) {}
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const override {
    return t_->Encode(text, add_special_tokens);
  }
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    return t_->Decode(ids, skip_special_tokens);
  }
  std::unique_ptr<TokenText> Stream(bool skip_special_tokens) const override {
    return std::make_unique<FileText>(t_->tokenizer(), skip_special_tokens);
  }
  const char* kind() const override { return "tokenizer.json"; }
  std::string Describe() const override { return t_->Describe(); }
  int64_t size() const override { return t_->tokenizer().vocab_size(); }
  std::optional<int32_t> eos_id() const override { return t_->eos_id(); }
  Result<std::string> RenderChat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const override {
    return t_->RenderChat(messages, add_generation_prompt, extra);
  }
  std::string chat_template() const override { return t_->chat_template_source(); }

 private:
  std::unique_ptr<text::CheckpointText> t_;
};

}  // namespace

std::unique_ptr<TextCodec> MakeByteCodec() { return std::make_unique<ByteCodec>(); }

Result<std::unique_ptr<TextCodec>> LoadTextCodec(const std::string& model_dir, int64_t model_vocab) {
  auto loaded = text::CheckpointText::Load(model_dir);
  if (!loaded.ok()) {
    // A file the tokenizer cannot read is a bad checkpoint, not a bad
    // flag: the engine refuses it for good (exit 78), as it does weights.
    if (loaded.error().code() == Code::kInvalidArgument) return Error(Code::kRefused, loaded.error().message());
    return loaded.error();
  }
  if (*loaded == nullptr) return MakeByteCodec();
  std::unique_ptr<text::CheckpointText> t = std::move(loaded).value();
  const int64_t n = t->tokenizer().vocab_size();
  if (n > model_vocab) {
    return Error(Code::kMismatch, JoinPath(model_dir, "tokenizer.json") + " has ids up to " + std::to_string(n - 1) +
                                      ", past the model's " + std::to_string(model_vocab) +
                                      " token rows (config.json vocab_size): the tokenizer belongs to another model; "
                                      "use the checkpoint's own tokenizer files");
  }
  return std::unique_ptr<TextCodec>(std::make_unique<FileCodec>(std::move(t)));
}

}  // namespace wsup::engine
