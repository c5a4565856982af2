// HttpClient: asynchronous HTTP/1.1 requests on a libuv loop, for the
// supervisor's probes and control calls to engines (and anything else on the
// loop that must talk HTTP without blocking it).
//
// Each request opens its own connection (Connection: close), sends the
// request, and reads the response with http-parser: Content-Length, chunked
// or until-close bodies, and server-sent events. One timer per request
// bounds the whole exchange (connect, send, complete response), so a hung
// server costs exactly timeout_ms. There is no connection pool: probes must
// see the engine accept a fresh connection, and a new connection per call
// cannot inherit a half-read response from an earlier one.
//
// Hosts are IP literals ("127.0.0.1", "::1", "[::1]") or "localhost"; names
// are not resolved (resolution could block or fail on its own, and the
// supervisor only talks to local engines).
//
// Callbacks: `done` runs exactly once per Send(), on the loop thread and
// never inside Send() itself: with the response (any status, 4xx and 5xx
// included) or with an Error:
//   kTimeout      no complete response within timeout_ms
//   kUnavailable  connect failed (refused, unreachable) or Cancel()
//   kIo           the connection broke (reset, closed before the end)
//   kCorrupt      the bytes are not an HTTP response
//   kRefused      the body is larger than max_body_bytes
//   kInvalidArgument  a host that is not an IP literal
// Messages start with "HOST:PORT: METHOD TARGET: ".
//
// Ownership: the HttpClient owns its requests; each request owns one tcp
// and one timer handle and is freed in the close callback of the last one.
// Destroying the client aborts what is in flight without running callbacks;
// run the loop afterwards so the close callbacks free the memory (the loop
// then closes clean). Threads: the loop thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "http/response.h"

namespace wsup::http {

// One server-sent event ("event:", "data:" lines joined with '\n', "id:").
struct ServerSentEvent {
  std::string event;  // "" for the default "message" type
  std::string data;
  std::string id;
};

// Incremental text/event-stream parser (the WHATWG rules: LF, CRLF or CR line
// ends, comments, multi-line data; an event is dispatched at a blank line).
// Bytes may be split anywhere, including between CR and LF.
class SseParser {
 public:
  using Sink = std::function<void(ServerSentEvent)>;
  void Feed(std::string_view bytes, const Sink& sink);

 private:
  void Line(std::string_view line, const Sink& sink);
  std::string line_;
  bool skip_lf_ = false;  // the previous byte was CR
  ServerSentEvent event_;
  bool have_data_ = false;
};

struct ClientRequest {
  std::string method = "GET";
  std::string target = "/";    // path and query
  std::vector<Header> headers;  // Host, Connection and Content-Length are added
  std::string body;
  int64_t timeout_ms = 5000;   // the whole exchange
  size_t max_body_bytes = 16 << 20;

  // Streaming, optional. on_head runs once the status and headers are in.
  // With on_data, body bytes (decoded from chunks) go to it as they arrive
  // and are not kept in the response. With on_event and a text/event-stream
  // response, each event goes to it instead. Neither counts against
  // max_body_bytes.
  std::function<void(const HttpResponse& head)> on_head;
  std::function<void(std::string_view data)> on_data;
  std::function<void(const ServerSentEvent& event)> on_event;
};

using ResponseCallback = std::function<void(Result<HttpResponse>)>;

class HttpClient {
 public:
  using RequestId = uint64_t;

  explicit HttpClient(uv_loop_t* loop);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Starts a request to host:port. The id can be passed to Cancel().
  RequestId Send(const std::string& host, int port, ClientRequest request, ResponseCallback done);

  // Ends a request in flight: its `done` runs with kUnavailable "cancelled"
  // before Cancel() returns. False when the id is not in flight.
  bool Cancel(RequestId id);
  void CancelAll();

  size_t in_flight() const { return requests_.size(); }
  uv_loop_t* loop() const { return loop_; }

 private:
  class Request;
  friend class Request;
  void Forget(RequestId id) { requests_.erase(id); }

  uv_loop_t* loop_;
  RequestId next_id_ = 1;
  std::unordered_map<RequestId, Request*> requests_;
};

}  // namespace wsup::http
