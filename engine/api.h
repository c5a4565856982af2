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

namespace wsup::engine {

struct CompletionRequest {
  std::vector<int32_t> prompt;
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
};

Result<CompletionRequest> ParseCompletionRequest(std::string_view body, const ApiLimits& limits);

struct CompletionText {
  std::string id;       // "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// The whole (non-streamed) response.
std::string CompletionJson(const CompletionText& c, const std::vector<int32_t>& tokens, const std::string& finish_reason,
                           bool token_ids, int64_t prompt_tokens);
// One stream chunk with the text of `tokens`; finish_reason empty: null.
std::string StreamChunkJson(const CompletionText& c, const std::vector<int32_t>& tokens,
                            const std::string& finish_reason, bool token_ids);
// The usage chunk sent before [DONE] when stream_options.include_usage.
std::string UsageChunkJson(const CompletionText& c, int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace wsup::engine
