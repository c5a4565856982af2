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

#include <nlohmann/json.hpp>

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

// POST /v1/chat/completions. The messages are kept as JSON for the
// chat template (each content a string: a list of text parts is joined
// with newlines, as vLLM does); `extra` holds the template's further
// variables (tools, and chat_template_kwargs' members). Generation takes
// `gen`; its prompt and max_tokens are set by FitChatPrompt() once the
// template has rendered and the text is encoded (without special tokens
// unless add_special_tokens: the template writes them).
struct ChatRequest {
  nlohmann::ordered_json messages;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
  bool add_special_tokens = false;
  CompletionRequest gen;
  nlohmann::json body;  // for FitChatPrompt: max_completion_tokens or max_tokens
};
Result<ChatRequest> ParseChatRequest(std::string_view body);
Status FitChatPrompt(std::vector<int32_t> prompt, const ApiLimits& limits, ChatRequest* r);

// The chat responses, as OpenAI's and vLLM's: the whole one, and the
// stream's chunks. The first chunk gives the role (and, with
// return_token_ids, prompt_token_ids, at the top level as vLLM puts them).
std::string ChatCompletionJson(const CompletionText& c, const std::string& text, const std::vector<int32_t>& tokens,
                               const std::string& finish_reason, const std::vector<int32_t>* prompt_ids,
                               int64_t prompt_tokens);
std::string ChatRoleChunkJson(const CompletionText& c, const std::vector<int32_t>* prompt_ids);
std::string ChatChunkJson(const CompletionText& c, const std::string& text, const std::vector<int32_t>& tokens,
                          const std::string& finish_reason, bool token_ids);
std::string ChatUsageChunkJson(const CompletionText& c, int64_t prompt_tokens, int64_t completion_tokens);

// POST /tokenize, shaped as vLLM's servers shape it:
//   {"prompt": "...", "add_special_tokens": true}
//     -> {"tokens": [...], "count": N, "max_model_len": L}
//   {"messages": [...], "add_generation_prompt": true} (a chat, rendered by
//     the chat template; add_special_tokens defaults to false)
struct TokenizeRequest {
  std::string prompt;
  bool add_special_tokens = true;
  std::optional<ChatRequest> chat;  // the messages form
};
Result<TokenizeRequest> ParseTokenizeRequest(std::string_view body);
std::string TokenizeJson(const std::vector<int32_t>& ids, int64_t max_model_len);

// POST /detokenize: {"tokens": [...]} -> {"prompt": "..."} (special tokens
// kept, as transformers' decode does by default). Ids must be in
// [0, vocab).
Result<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body, int64_t vocab);
std::string DetokenizeJson(const std::string& text);

}  // namespace wsup::engine
