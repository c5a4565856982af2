// The engine's text: how a prompt's text becomes token ids and generated
// ids become text. A checkpoint with its own tokenizer files is served with
// them (text/checkpoint_text.h); one without keeps the byte tokenizer of
// the test checkpoints: one token per UTF-8 byte of the prompt, no special
// tokens, and token id t rendered as the character U+00tt (so response
// text is the UTF-8 encoding of those code points).
//
// Completions, the stream's deltas, /tokenize and /detokenize all go
// through one TextCodec. Immutable; any thread. A TokenText (one stream's
// decoder) belongs to its request.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup::engine {

// The byte tokenizer's parts (also used directly by tests and tools).
std::vector<int32_t> EncodeBytes(std::string_view text);
// Appends the UTF-8 encoding of code point `token` (ids past U+10FFFF or in
// the surrogate range render as U+FFFD).
void AppendTokenText(int32_t token, std::string* out);
std::string DecodeTokens(const std::vector<int32_t>& tokens);

// One request's streamed text: each new id's text, never part of a
// character, and all of it (with Finish()) equal to Decode() of the ids.
class TokenText {
 public:
  virtual ~TokenText() = default;
  virtual std::string Add(int32_t id) = 0;
  virtual std::string Finish() = 0;
  // The sequence goes on after `context` (text/tokenizer.h StreamDecoder::
  // Prime): a continuation's first text completes what its prompt left.
  virtual void Prime(const std::vector<int32_t>& context) = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // add_special_tokens: as transformers' encode (a Llama-3 prompt gets its
  // BOS); a chat rendered by its template is encoded without.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
  virtual std::unique_ptr<TokenText> Stream(bool skip_special_tokens) const = 0;
  // "bytes" or "tokenizer.json", and a line for /wsup/status.
  virtual const char* kind() const = 0;
  virtual std::string Describe() const = 0;
  // The ids the tokenizer may produce (the byte tokenizer: 256).
  virtual int64_t size() const = 0;
  // tokenizer_config.json's eos_token: generation stops there too.
  virtual std::optional<int32_t> eos_id() const { return std::nullopt; }
  // The chat rendered by the checkpoint's chat template
  // (text/checkpoint_text.h RenderChat); a Refused error without one.
  virtual Result<std::string> RenderChat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                         const nlohmann::ordered_json& extra) const = 0;
  // Where the chat template came from; "" without one.
  virtual std::string chat_template() const { return {}; }
};

std::unique_ptr<TextCodec> MakeByteCodec();

// The codec for the checkpoint in model_dir, whose embedding has
// `model_vocab` rows: its own tokenizer files if it has them (a tokenizer
// with ids past the model's rows is refused: the model cannot read them),
// else the byte tokenizer.
Result<std::unique_ptr<TextCodec>> LoadTextCodec(const std::string& model_dir, int64_t model_vocab);

}  // namespace wsup::engine
