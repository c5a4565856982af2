// CompletionStream: the front's view of one streamed completion as its
// server-sent events pass from an engine to the client.
//
// The engine's body is cut into events at blank lines; only complete events
// are forwarded, so a stream cut in the middle of an event never shows the
// client half of it, and the tokens of that half-event count as not
// delivered. From each event it records the token ids delivered (the front
// asked the engine for `return_token_ids`), whether a finish_reason was
// seen, and whether `data: [DONE]` went through; from the first event that
// has them, the prompt's token ids (`prompt_token_ids`: in the choice of a
// completion chunk, at the top of a chat chunk, as vLLM's servers put them).
//
// Rewrites, only where needed (events are otherwise forwarded byte for
// byte): `token_ids` and `prompt_token_ids` are removed when the client did
// not ask for them (and a continuation's prompt ids always: they are the
// first prompt's plus what was delivered); after a resume the continuation's events carry the first stream's
// `id`, and its `usage` is shifted so that the tokens delivered before the
// cut count as completion tokens, not prompt tokens, exactly as in an
// uninterrupted stream.
//
// A stream is "trackable" while every event told which tokens it carried;
// an event with text but no token ids, or one that is not JSON (or is
// past the shared JSON limits of common/json_limits.h, and so is passed on
// unparsed), makes it untrackable and a cut is then not resumable.
//
// Pure (no sockets); owned by one proxied call on the loop thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace wsup::front {

class CompletionStream {
 public:
  // strip_token_ids: the client did not ask for token ids. chat: a chat
  // stream (chat.completion.chunk events), whose continuation comes as a
  // token-id completion's events and is turned back into chat chunks.
  explicit CompletionStream(bool strip_token_ids, bool chat = false) : strip_(strip_token_ids), chat_(chat) {}

  // Feeds engine body bytes; appends what the client must see to *out.
  void Feed(std::string_view data, std::string* out);
  // The bytes that follow come from a resumed request: an unfinished event
  // of the dead stream is dropped.
  void BeginContinuation();
  // The bytes that end the client's stream when the engine died after the
  // last token (finish_reason seen, or no tokens left) but before [DONE].
  std::string SynthesizeEnd(std::string_view finish_reason);

  bool done() const { return done_; }          // "data: [DONE]" forwarded
  bool finished() const { return finished_; }  // a choice had a finish_reason
  bool trackable() const { return trackable_; }
  bool error_seen() const { return error_seen_; }  // the engine sent an error event
  const std::vector<int64_t>& delivered() const { return delivered_; }
  // The prompt's ids as the engine reported them (empty until then).
  bool prompt_reported() const { return prompt_reported_; }
  const std::vector<int64_t>& prompt_ids() const { return prompt_ids_; }
  size_t events() const { return events_; }

  // Largest event accepted; a bigger one makes the stream untrackable and is
  // passed through as it comes.
  static constexpr size_t kMaxEventBytes = 4 << 20;

 private:
  void OnEvent(std::string_view raw, std::string* out);

  // A continuation's text_completion event as the chat chunk the client's
  // stream is made of.
  static void ToChatChunk(nlohmann::ordered_json* j);

  bool strip_;
  bool chat_;
  std::string buf_;
  bool done_ = false;
  bool finished_ = false;
  bool trackable_ = true;
  bool error_seen_ = false;
  bool continuation_ = false;
  bool passthrough_ = false;
  size_t resume_offset_ = 0;  // tokens delivered before the latest resume
  size_t events_ = 0;
  std::string first_id_;
  std::vector<int64_t> delivered_;
  bool prompt_reported_ = false;
  std::vector<int64_t> prompt_ids_;
};

}  // namespace wsup::front
