// The front's upstream side: HTTP/1.1 client connections to the engines,
// one request at a time each, kept alive in a small pool per backend.
//
// This is proxy-specific on purpose (http/client.h is the general client):
// the response is handed over as it arrives (head, then body pieces), and a
// failure says exactly how far the exchange got (connect, awaiting the
// response, mid-response) and whether the connection was a reused one. The
// proxy needs both to decide between "retry invisibly", "switch backend",
// "resume the stream" and "cut the client off".
//
// Ownership: the UpstreamPool owns every Backend and every UpstreamConn. A
// connection is lent to one Listener (a proxied call) from Send() until the
// listener hears OnUpstreamDone or OnUpstreamError, or gives it back with
// Abort(). A connection's tcp and timer handles are closed by the
// connection and it is freed in the last close callback. A Backend lives
// while a route, an in-flight call or a connection refers to it
// (UpstreamPool::Collect()).
// Threads: the loop thread only.
#pragma once

#include <http_parser.h>
#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/close_latch.h"
#include "front/address.h"
#include "http/parser_settings.h"
#include "http/request.h"

namespace wsup::front {

class UpstreamConn;
class UpstreamPool;
struct SharedBackend;

// One engine address and what the front knows about it.
struct Backend {
  std::string name;  // "127.0.0.1:8001", as in routes and status
  HostPort addr;
  int inflight = 0;             // calls with a request on it now
  int64_t down_until_ms = 0;    // loop time before which it is not tried
  int failures = 0;             // consecutive connection failures
  std::string last_error;       // the latest failure, for 503 messages
  int64_t failed_at_ms = 0;     // wall time of the latest failure (0: none seen)
  int64_t last_ok_ms = 0;       // wall time of its latest 2xx answer head (0: none seen)
  SharedBackend* shared = nullptr;  // what every loop of the front knows of it (front/shared.h)
  std::vector<UpstreamConn*> idle;  // kept-alive connections, most recent last
  size_t conns = 0;             // open connections of any state
  bool routed = false;          // the active or standby route names it
};

struct UpstreamError {
  enum class Stage {
    kConnect,           // no connection was made: the request never left
    kAwaitingResponse,  // the request was (being) sent, no response byte came
    kMidResponse,       // part of the response had arrived
  };
  Stage stage = Stage::kConnect;
  int code = 0;          // a libuv error (UV_ECONNREFUSED, UV_EOF, ...); UV_EPROTO for a bad response,
                         // UV_ESRCH for an engine its supervisor saw die
  bool reused = false;   // the connection had served earlier requests
  std::string detail;    // for a malformed response: what was wrong

  // "connection refused", "closed the connection before answering", ...
  std::string Describe() const;
};

class UpstreamListener {
 public:
  virtual ~UpstreamListener() = default;
  // The response head. `headers` may be moved from.
  virtual void OnUpstreamHead(int status, std::vector<http::Header>* headers) = 0;
  virtual void OnUpstreamBody(std::string_view data) = 0;
  // The response is complete; the connection went back to the pool (or was closed).
  virtual void OnUpstreamDone() = 0;
  virtual void OnUpstreamError(const UpstreamError& error) = 0;
};

struct UpstreamOptions {
  int64_t connect_timeout_ms = 2'000;
  int64_t idle_timeout_ms = 20'000;  // below the engines' keep-alive timeout, so they never close first
  size_t max_idle_per_backend = 64;  // the front raises it to its loop's share of --max-connections
  size_t max_header_bytes = size_t{64} * 1024;
  size_t max_headers = 100;
};

class UpstreamConn {
 public:
  // Sends one request: head (request line and headers, ending in a blank
  // line) and body. Both must stay valid until the listener hears back.
  // `head_request`: a HEAD request, whose response has no body.
  void Send(UpstreamListener* listener, std::string_view head, std::string_view body, bool head_request);
  // Abandons the request: the connection is closed, the listener hears nothing more.
  void Abort();
  // The engine is known dead: the connection is closed and the listener, if
  // any, hears `code` (UV_ESRCH: "died (detail)") as if it had been reset.
  // True when a request was in flight on it.
  bool Cut(int code, std::string detail);
  // Hands the exchange in progress to another listener (a hedge that won:
  // the call takes over the attempt that had been listened to apart).
  void Rebind(UpstreamListener* listener) { listener_ = listener; }
  // Flow control for a client that reads slower than the engine writes.
  void PauseReading();
  void ResumeReading();

  Backend* backend() const { return backend_; }
  bool reused() const { return served_ > 0; }

  // Internal: made and owned by UpstreamPool.
  UpstreamConn(UpstreamPool* pool, Backend* backend);
  void Connect();
  void BecomeIdle();
  void TakeFromIdle();
  void Close();

 private:
  enum class State { kConnecting, kIdle, kBusy, kClosed };

  template <typename>
  friend const http_parser_settings* http::ResponseSettings();
  static void OnConnect(uv_connect_t* req, int status);
  static void OnAlloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
  static void OnRead(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
  static void OnWritten(uv_write_t* req, int status);
  static void OnTimer(uv_timer_t* t);
  static void OnClosed(uv_handle_t* h);
  static int OnHeaderField(http_parser* p, const char* at, size_t len);
  static int OnHeaderValue(http_parser* p, const char* at, size_t len);
  static int OnHeadersComplete(http_parser* p);
  static int OnBody(http_parser* p, const char* at, size_t len);
  static int OnMessageComplete(http_parser* p);

  void StartWrite();
  void StartReading();
  void OnData(const char* data, size_t len);
  void OnEof();
  void Fail(int code, std::string detail = {});
  void Finish();
  int ProtocolError(std::string detail);

  UpstreamPool* pool_;
  Backend* backend_;
  uv_tcp_t tcp_;
  uv_timer_t timer_;
  uv_connect_t connect_req_;
  uv_write_t write_req_;
  http_parser parser_;
  State state_ = State::kConnecting;
  int open_handles_ = 0;
  bool reading_ = false;
  bool paused_ = false;
  bool writing_ = false;
  bool head_request_ = false;
  bool response_started_ = false;
  bool skip_interim_ = false;  // a 1xx response is being skipped
  bool complete_ = false;
  bool keep_alive_ = false;
  bool last_was_value_ = false;
  int pending_error_ = 0;  // a synchronous connect failure, reported from the timer
  size_t header_bytes_ = 0;
  uint64_t served_ = 0;
  UpstreamListener* listener_ = nullptr;
  std::string_view head_;
  std::string_view body_;
  std::vector<http::Header> headers_;
  std::string protocol_error_;
};

class UpstreamPool {
 public:
  UpstreamPool(uv_loop_t* loop, UpstreamOptions options);
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  // The backend for an address, made on first use.
  Backend* Get(const HostPort& addr);
  // A connection to `b`: a kept-alive one unless `fresh`, else a new one
  // (connecting; Send() may be called at once).
  UpstreamConn* Acquire(Backend* b, bool fresh);
  // Closes the idle connections of backends no route names, and forgets
  // backends with nothing left.
  void Collect();
  // Cuts every connection to `b` (UpstreamConn::Cut); returns how many had
  // a request in flight.
  size_t CutBackend(Backend* b, int code, const std::string& detail);
  // The backend of an address, if one is known.
  Backend* Find(const std::string& name) const;
  // Closes every connection; `done` runs once all are freed.
  void Close(std::function<void()> done = {});

  const std::map<std::string, std::unique_ptr<Backend>>& backends() const { return backends_; }
  uv_loop_t* loop() const { return loop_; }
  const UpstreamOptions& options() const { return options_; }

  // Internal: used by UpstreamConn.
  void Release(UpstreamConn* c);
  void Forget(UpstreamConn* c);

 private:
  uv_loop_t* loop_;
  UpstreamOptions options_;
  std::map<std::string, std::unique_ptr<Backend>> backends_;
  std::unordered_set<UpstreamConn*> all_;  // every open connection, for Close()
  // Done once every connection is gone.
  CloseLatch close_{[this] { return all_.empty(); }};
};

}  // namespace wsup::front
