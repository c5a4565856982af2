// ScriptedServer: a raw HTTP server on a libuv loop for the client and probe
// tests. A handler sees each parsed request and returns the exact bytes to
// answer with (in pieces, optionally spaced out by loop timers) and what to
// do afterwards (close, reset, keep open), or to hang without answering.
// Bytes are raw so tests can send what a real server never would: broken
// framing, truncated bodies, resets.
//
// Ownership: owns its listener and connections; Close() closes them all and
// `done` runs once the last close callback has. Loop thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "http/request.h"

namespace wsup::test {

struct ScriptedReply {
  std::vector<std::string> pieces;  // written in order
  int64_t piece_delay_ms = 0;       // loop-timer gap between pieces
  enum class After { kClose, kReset, kKeepOpen } after = After::kClose;
  bool hang = false;                // never answer; keep reading
};

// "HTTP/1.1 <status> X\r\nContent-Type: ...\r\nContent-Length: n\r\n\r\n<body>"
std::string RawResponse(int status, const std::string& body, const std::string& content_type = "application/json");

class ScriptedServer {
 public:
  using Handler = std::function<ScriptedReply(const http::HttpRequest&)>;

  ScriptedServer(uv_loop_t* loop, Handler handler);
  ~ScriptedServer();
  ScriptedServer(const ScriptedServer&) = delete;
  ScriptedServer& operator=(const ScriptedServer&) = delete;

  // Binds 127.0.0.1 on a free port.
  Status Listen();
  int port() const { return port_; }
  void Close(std::function<void()> done = {});

  int accepted() const { return accepted_; }
  const std::vector<http::HttpRequest>& requests() const { return requests_; }

  // Internal: used by connections.
  class Conn;
  void Forget(Conn* c);
  ScriptedReply Handle(const http::HttpRequest& r) {
    requests_.push_back(r);
    return handler_(r);
  }
  uv_loop_t* loop() const { return loop_; }

 private:
  static void OnConnection(uv_stream_t* s, int status);
  void MaybeDone();

  uv_loop_t* loop_;
  Handler handler_;
  uv_tcp_t* listener_ = nullptr;
  bool listener_open_ = false;
  int port_ = 0;
  int accepted_ = 0;
  std::set<Conn*> conns_;
  std::vector<http::HttpRequest> requests_;
  std::function<void()> done_;
  bool closing_ = false;
};

// A port on 127.0.0.1 where nothing listens (bound, then closed).
int UnusedPort();

// Runs the loop until cond() holds or `limit_ms` of loop time passes
// (a timer keeps the loop awake). Returns whether cond() held.
bool RunUntil(uv_loop_t* loop, const std::function<bool()>& cond, int64_t limit_ms = 10'000);

// Closes every handle still open, runs the loop until they are closed, and
// returns uv_loop_close()'s result (0 when the loop closed clean).
int CloseLoop(uv_loop_t* loop);

}  // namespace wsup::test
