// FakeEngine: an in-test stand-in for wsup-engine, on its own libuv loop in
// its own thread, speaking the completion API the front proxies (JSON and
// server-sent event streams, return_token_ids, usage) and able to misbehave
// on cue: close a connection before answering, die in the middle of a
// stream or a body, or stream slowly.
//
// Its "model" is deterministic and depends on the whole context (prompt
// plus generated tokens), like greedy decoding: a stream resumed with
// prompt + delivered tokens continues exactly where an uninterrupted run
// would have gone, so tests can compare the two.
//
// Settings are atomics, read on the engine's loop thread per request.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "http/server.h"

namespace wsup::test {

// The next `n` tokens after `context` (each in 0..255).
std::vector<int64_t> FakeGenerate(std::vector<int64_t> context, int n);
// Token t as the character U+00tt, UTF-8 encoded (the engines' rendering).
std::string FakeText(const std::vector<int64_t>& ids);
// The fake engine's tokenizer: a string prompt as a BOS (999), then 1000 +
// each UTF-8 byte. Not one token per byte, on purpose: a front that
// guessed a prompt's ids from its text would resume wrongly, and the tests
// would see it.
std::vector<int64_t> FakeTokenize(const std::string& s);
// The fake engine's chat template: "role:content\n" for each message.
std::string FakeRender(const nlohmann::json& messages);

class FakeEngine {
 public:
  enum Mode : int {
    kNormal = 0,
    kCloseOnRequest,  // closes the connection without a byte of answer
    kDieAfterTokens,  // streams die_after events, then drops the connection
    kPartialBody,     // non-streamed answers: sends part of a chunked body, then drops the connection
    kHold,            // non-streamed completions: never answered, held until the connection closes
  };

  explicit FakeEngine(std::string name);
  ~FakeEngine();
  FakeEngine(const FakeEngine&) = delete;
  FakeEngine& operator=(const FakeEngine&) = delete;

  int port() const { return port_; }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& name() const { return name_; }
  // Closes the server and its connections; the port then refuses.
  void Stop();

  std::atomic<int> mode{kNormal};
  std::atomic<int> misbehave_times{1 << 30};  // how many requests the mode applies to; then normal
  std::atomic<int> die_after{3};
  std::atomic<int> token_delay_ms{0};
  // With return_token_ids: the prompt's ids in the first chunk (as
  // wsup-engine and vLLM's servers report them). Off: an engine that never
  // says, whose cut streams the front must not resume.
  std::atomic<bool> report_prompt_ids{true};
  std::atomic<int> requests{0};
  std::atomic<int> completions{0};
  std::atomic<int> streams_active{0};
  std::atomic<int> tokens_sent{0};    // stream events written, over all streams
  std::atomic<int> client_closed{0};  // streams whose connection closed before the end
  std::atomic<int> held{0};           // kHold completions received
  std::atomic<int> held_closed{0};    // ... whose connection then closed (the front gave up on them)

  std::string last_body();
  std::string last_path();
  std::string last_request_id();
  std::string last_resume_mark();  // the last request's X-Wsup-Resume ("" without one)
  std::string last_probe_mark();   // the last request's X-Wsup-Probe ("" without one)

 private:
  struct Stream;
  void Handle(std::shared_ptr<http::ResponseWriter> w);
  void Complete(std::shared_ptr<http::ResponseWriter> w);
  void StartStream(std::shared_ptr<http::ResponseWriter> w, std::vector<int64_t> prompt, int max_tokens, bool ids,
                   bool misbehave, bool chat = false);
  void StepStream(Stream* s);
  void EndStream(Stream* s);
  bool Misbehave(int m);

  std::string name_;
  uv_loop_t loop_;
  uv_async_t stop_;
  std::unique_ptr<http::HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
  bool stopped_ = false;
  uint64_t next_id_ = 0;
  std::unordered_set<Stream*> streams_;
  std::vector<std::shared_ptr<http::ResponseWriter>> held_;
  std::mutex mu_;
  std::string last_body_;
  std::string last_path_;
  std::string last_request_id_;
  std::string last_resume_mark_;
  std::string last_probe_mark_;
};

}  // namespace wsup::test
