// What the front needs to know about a `POST /v1/completions` request to
// resume its stream on another engine, and the request bodies it sends.
//
// ReadCompletion is the one reading of a client's body: checked against the
// JSON limits once, parsed once (only when it may ask for a stream), and the
// parsed request kept in the plan, from which every resume and hedge body is
// made (ResumeBody) without parsing again.
//
// PlanCompletion reads the client's JSON body once. For a streamed request
// it rewrites the body the engine receives: `return_token_ids: true` (so the
// front learns which tokens it has delivered) and an explicit `max_tokens`
// (so "how many remain" is exact even when the client relied on a default).
// A prompt given as token ids is recorded as it is. A text prompt is never
// tokenized here: only the engine knows its tokenizer, and it reports the
// prompt's ids in the stream's first chunk (prompt_token_ids, answering
// return_token_ids as vLLM's servers do; front/sse_relay.h keeps them).
// A stream whose prompt ids are known neither way is not continued after a
// cut (docs/front.md, "What an engine must do to have its streams resumed").
//
// ResumeBody builds the request that continues a stream cut after some
// tokens: prompt = the prompt's ids + delivered ids, max_tokens = what
// remains.
// With temperature > 0 and a client-given seed, the seed is derived from the
// number of delivered tokens so the continuation is not a replay of the
// sampling sequence; sampled output is then not bit-identical to an
// uninterrupted run (greedy output is).
//
// A streamed chat (`POST /v1/chat/completions`) is planned the same way:
// `return_token_ids` and an explicit `max_tokens` (or the client's
// `max_completion_tokens`) are added, and the prompt's ids come from the
// engine (a chat chunk carries them at the top, as vLLM's servers put
// them). Its continuation is a token-id completion sent to
// `/v1/completions` (kResumeTarget), whose events the stream relay turns
// back into chat chunks, so the client sees one unbroken chat stream.
//
// Non-streamed completions are not rewritten: a cut-off one is retried as
// sent. Plain values; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup::front {

// Its implicit members only make empty values and move them: a null json
// allocates nothing and throws nothing.
struct CompletionPlan {  // NOLINT(bugprone-exception-escape): see above
  bool stream = false;           // the client asked for server-sent events
  bool chat = false;             // a chat completion (continued as a token-id completion)
  bool resumable = false;        // a cut stream can be continued elsewhere
  std::string not_resumable;     // why not, for logs (empty when resumable)
  bool client_wants_token_ids = false;
  bool prompt_ids_given = false;  // the client sent the prompt as token ids
  std::vector<int64_t> prompt_ids;  // ... these
  int64_t max_tokens = 0;        // as sent to the engine
  std::string upstream_body;     // the body the engine receives (rewritten for streams)
  nlohmann::ordered_json request;  // the rewritten request (streams only)
};

// Ok when a completion body is within the shared JSON limits
// (common/json_limits.h: the nesting bound; the HTTP server bounds the
// size). Otherwise an InvalidArgument for the client's 400, worded like the
// engine's. The front checks every `POST /v1/completions` body with it, so
// a body the engines would refuse never reaches one, and none reaches the
// parser below.
Status CheckCompletionBody(std::string_view body);

// The front's reading of a `POST /v1/completions` body: an error (the
// client's 400, CheckCompletionBody's words) past the JSON limits; else Ok,
// with `plan` planned when the body asks for a stream (plan->stream), and
// left as not a stream when it cannot (MayRequestStream: no parse) or is not
// a JSON object (forwarded unchanged: the engine answers it).
// chat: the body is a `POST /v1/chat/completions`.
Status ReadCompletion(std::string_view body, int64_t default_max_tokens, CompletionPlan* plan, bool chat = false);

// Where a continuation goes: a completion's to its own route, a chat's as a
// token-id completion.
inline constexpr const char* kResumeTarget = "/v1/completions";

// Returns false when the body is not a JSON object, or fails
// CheckCompletionBody (the front then forwards it unchanged and lets the
// engine answer 400). `default_max_tokens` is the engines' default, made
// explicit in streamed requests.
bool PlanCompletion(std::string_view body, int64_t default_max_tokens, CompletionPlan* plan, bool chat = false);

// The body that continues a stream of the prompt `prompt_ids` after
// `delivered` tokens; `remaining` (> 0) new tokens are asked for. With
// neither (a stream cut before its first token, whose engine had not yet
// reported the prompt's ids), the client's prompt is sent again as it was.
std::string ResumeBody(const CompletionPlan& plan, const std::vector<int64_t>& prompt_ids,
                       const std::vector<int64_t>& delivered, int64_t remaining);

// Cheap test used before any JSON parsing: false means the body cannot ask
// for streaming, so a non-streamed completion costs no parse at all.
bool MayRequestStream(std::string_view body);

}  // namespace wsup::front
