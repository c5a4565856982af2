// FakeEngine: the engine contract's HTTP side alone, for the supervisor's
// logic tests (logic_rig.h): GET /wsup/status (ready, the nonce it was
// given, its kv), POST /v1/completions (the probe's expected text), and
// POST /wsup/role, which it records and answers as a --kv-pool engine
// would (or as the test tells it: refuse a release, or never answer). With
// a control token (the one the supervisor gave it), the /wsup routes answer
// 401 to a request without it, as the reference engine's do; a test may
// also make it map the pool on its own (MapPoolUnasked), as a broken engine
// would.
//
// It serves on its own libuv loop and thread, on the port the supervisor
// picked for the slot (or, as a front, on the front's listening socket),
// until Stop() (its process "died").
//
// Thread-safety: every public method from any thread.
#pragma once

#include <uv.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/server.h"

namespace wsup::logic {

class FakeEngine {
 public:
  struct RoleCall {
    uint64_t seq = 0;  // FakeEngine::NextSeq() at arrival: orders calls of every engine and the test's marks
    std::string role;
    std::string kv;
  };
  enum class Release { kOk, kRefuse, kHang };

  FakeEngine(int port, std::string nonce, std::string probe_text, std::string control_token = "");
  // A front on the listening socket the supervisor handed its front (a
  // dup of listen_fd is served): completions answer probe_text, so that a
  // failover's probe through the front proves it.
  static std::unique_ptr<FakeEngine> Front(int listen_fd, std::string probe_text);
  ~FakeEngine();
  FakeEngine(const FakeEngine&) = delete;
  FakeEngine& operator=(const FakeEngine&) = delete;

  bool Start();  // false when the port cannot be bound
  void Stop();

  std::vector<RoleCall> role_calls() const;
  bool pool_mapped() const { return pool_mapped_.load(); }
  void set_release(Release r) { release_ = r; }
  // It maps the pool though nobody asked it to.
  void MapPoolUnasked() { pool_mapped_ = true; }
  // Streams it says it resumed from a dead engine's KV (its status's
  // resume.adopted_sequences).
  void set_resumed(uint64_t n) { resumed_ = n; }
  // Whether its status says its communicator is warm (true by default).
  void set_warm(bool w) { warm_ = w; }
  // Control requests refused for want of the token.
  int unauthorized() const { return unauthorized_.load(); }
  // A process-wide counter that orders events across engines and the test.
  static uint64_t NextSeq();

 private:
  void Handle(std::shared_ptr<http::ResponseWriter> w);
  std::string KvJson() const;

  int port_;
  int adopt_fd_ = -1;  // a front's: served instead of binding port_
  std::string nonce_;
  std::string probe_text_;
  std::string control_token_;
  std::atomic<int> unauthorized_{0};
  std::atomic<uint64_t> resumed_{0};
  std::atomic<bool> warm_{true};
  std::atomic<bool> pool_mapped_{false};
  std::atomic<Release> release_{Release::kOk};
  mutable std::mutex mu_;
  std::vector<RoleCall> calls_;
  std::vector<std::shared_ptr<http::ResponseWriter>> hung_;  // answers held back (kHang), on the loop thread

  uv_loop_t loop_{};
  uv_async_t stop_{};
  std::unique_ptr<http::HttpServer> server_;
  std::thread thread_;
  bool started_ = false;
};

}  // namespace wsup::logic
