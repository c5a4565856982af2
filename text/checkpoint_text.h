// CheckpointText: the text side of a checkpoint folder, as transformers'
// AutoTokenizer reads it: tokenizer.json (tokenizer.h) and, beside it,
// tokenizer_config.json, which may change what "add the special tokens"
// means and names the special tokens. A folder without tokenizer.json has
// no text side (the engine keeps its byte tokenizer).
//
// tokenizer_config.json's add_bos_token and add_eos_token: the tokenizer
// classes whose transformers implementation rebuilds the post-processor
// from them (LlamaTokenizer, CodeLlamaTokenizer, GemmaTokenizer and their
// Fast forms; DeepSeek-V3 ships as LlamaTokenizerFast with add_bos_token)
// put bos_token before a prompt and eos_token after it, in place of
// tokenizer.json's post-processor. For other classes the file's own
// post-processor decides, as it does in transformers.
//
// The chat template: chat_template.jinja beside the files (transformers
// writes it there since 4.43), else tokenizer_config.json's chat_template
// (a string, or a list of named templates: the one named "default"). It is
// parsed at the load, so a construct outside the subset (text/jinja.h)
// refuses the load with its line, never a request.
//
// Immutable after the load; any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "text/jinja.h"
#include "text/tokenizer.h"

namespace wsup::text {

class CheckpointText {
 public:
  // Reads `dir`'s tokenizer files. nullptr (not an error) when there is no
  // tokenizer.json and no tokenizer.model. A tokenizer.model alone is
  // refused (SentencePiece files are read only as tokenizer.json), as is a
  // file that cannot be read exactly.
  static Result<std::unique_ptr<CheckpointText>> Load(const std::string& dir);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // add_special_tokens as transformers' encode applies it (above).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
    return tokenizer_->Decode(ids, skip_special_tokens);
  }

  // tokenizer_config.json's tokenizer_class ("" when not given).
  const std::string& tokenizer_class() const { return class_; }
  // The ids of bos_token and eos_token (nullopt: not set, or not a token).
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  // "tokenizer.json (BPE byte-level, 151669 ids, ...), Qwen2Tokenizer".
  std::string Describe() const;

  bool has_chat_template() const { return chat_ != nullptr; }
  // Where the chat template came from ("" without one).
  const std::string& chat_template_source() const { return chat_source_; }
  // The chat rendered as transformers' apply_chat_template(messages,
  // add_generation_prompt=..., tokenize=False, **extra) renders it: the
  // variables are messages, add_generation_prompt, tools (null), the
  // special tokens of tokenizer_config.json (bos_token, eos_token, ...),
  // then `extra`'s members. Without a template: a Refused error.
  Result<std::string> RenderChat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const;

 private:
  Status SetChatTemplate(const std::string& source, const std::string& name);

  std::unique_ptr<Tokenizer> tokenizer_;
  std::string class_;
  std::optional<int32_t> bos_id_, eos_id_;
  // Set when tokenizer_config.json rebuilds the post-processor.
  bool own_specials_ = false;
  std::vector<int32_t> prefix_, suffix_;
  std::unique_ptr<jinja::Template> chat_;
  std::string chat_source_;
  // The special tokens' text by name (bos_token, ...), as templates see them.
  nlohmann::ordered_json special_vars_ = nlohmann::ordered_json::object();
};

}  // namespace wsup::text
