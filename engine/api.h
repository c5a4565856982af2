// The OpenAI-compatible completion API: parsing and validating a
// /v1/completions request body, and rendering responses and stream chunks.
//
// Validation is strict about what the engine would otherwise get wrong
// (types, ranges, unsupported options that change results) and lenient
// about the rest (unknown fields are ignored). Every refusal is an
// InvalidArgument whose message names the field, what was sent and what is
// allowed. Nothing here throws; the fuzz target feeds it arbitrary bytes.
// A body nested deeper than the shared JSON limit (common/json_limits.h) is
// refused before it is parsed.
//
// Defaults: max_tokens 16, temperature 0 (greedy: a reference engine
// answers deterministically unless asked to sample), stream false.
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer.h"

namespace wsup::engine {

struct CompletionRequest {
  std::vector<int32_t> prompt;  // a text prompt encoded with its special tokens
  int max_tokens = 16;
  double temperature = 0;
  std::optional<uint64_t> seed;
  bool stream = false;
  bool return_token_ids = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string model;
};

struct ApiLimits {
  int64_t vocab = 256;
  int64_t context = 2048;  // positions a sequence may use (prompt + max_tokens)
  // How a text prompt is encoded; null: the byte tokenizer.
  const TextCodec* text = nullptr;
};

Result<CompletionRequest> ParseCompletionRequest(std::string_view body, const ApiLimits& limits);

struct CompletionText {
  std::string id;       // "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// The whole (non-streamed) response: `text` is what `tokens` decode to.
// prompt_ids non-null (return_token_ids): the choice carries the prompt's
// ids (prompt_token_ids) and the output's (token_ids), as vLLM's servers
// answer it.
std::string CompletionJson(const CompletionText& c, const std::string& text, const std::vector<int32_t>& tokens,
                           const std::string& finish_reason, const std::vector<int32_t>* prompt_ids,
                           int64_t prompt_tokens);
// One stream chunk: `text` and the ids it came from; finish_reason empty:
// null. token_ids: the chunk carries its ids; prompt_ids non-null: and the
// prompt's (the first chunk of a stream with return_token_ids).
std::string StreamChunkJson(const CompletionText& c, const std::string& text, const std::vector<int32_t>& tokens,
                            const std::string& finish_reason, bool token_ids, const std::vector<int32_t>* prompt_ids);
// The usage chunk sent before [DONE] when stream_options.include_usage.
std::string UsageChunkJson(const CompletionText& c, int64_t prompt_tokens, int64_t completion_tokens);

// POST /tokenize, shaped as vLLM's servers shape it:
//   {"prompt": "...", "add_special_tokens": true}
//     -> {"tokens": [...], "count": N, "max_model_len": L}
struct TokenizeRequest {
  std::string prompt;
  bool add_special_tokens = true;
};
Result<TokenizeRequest> ParseTokenizeRequest(std::string_view body);
std::string TokenizeJson(const std::vector<int32_t>& ids, int64_t max_model_len);

// POST /detokenize: {"tokens": [...]} -> {"prompt": "..."} (special tokens
// kept, as transformers' decode does by default). Ids must be in
// [0, vocab).
Result<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body, int64_t vocab);
std::string DetokenizeJson(const std::string& text);

}  // namespace wsup::engine
