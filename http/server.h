// HttpServer: HTTP/1.1 on a libuv loop. Accepts connections, parses requests
// with RequestParser, hands each complete request to one Handler, and writes
// the responses back in request order (pipelining), with Content-Length or
// chunked (streaming, server-sent events) framing and keep-alive.
//
// Time bounds, so that no peer can hold a connection open by being slow:
//   header_timeout_ms: from the first byte of a request to the end of its
//     headers (not reset by each byte: one byte a second still times out);
//   body_timeout_ms: from the end of the headers to the end of the body;
//   idle_timeout_ms: a keep-alive connection with nothing in flight;
//   write_timeout_ms: queued response bytes that the peer does not read.
// Malformed requests get a 4xx answer (400, 413, 431, 408) and the
// connection is closed after it, lingering briefly so the peer can read it.
//
// Ownership: the HttpServer owns the listening handle and every Connection;
// each Connection owns its tcp and timer handles and is freed in the close
// callback of the last of them. Close() closes all of them; the loop then
// ends clean (uv_loop_close() returns 0) once `done` has run.
//
// Threads: everything here, ResponseWriter included, is called on the loop
// thread only. Work done elsewhere comes back to the loop (uv_async) before
// it touches a ResponseWriter.
//
// Reuse: the data-plane proxy uses the same server with a handler that
// forwards the request and streams the upstream's answer through
// StartStream()/Write()/End(), and OnClose() to learn of a vanished client.
//
// A client is taken as gone when its connection errs, when a write to it
// fails, and (ServerOptions::serve_half_closed, off by default) when it
// sends EOF while a request of it is in flight: OnClose() runs in all three.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>

#include "common/close_latch.h"
#include "common/status.h"
#include "http/request.h"
#include "http/response.h"

namespace wsup::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: the kernel picks one; port() tells which
  int backlog = 511;
  ParserLimits limits;
  int64_t header_timeout_ms = 10'000;
  int64_t body_timeout_ms = 30'000;
  int64_t idle_timeout_ms = 60'000;
  int64_t write_timeout_ms = 30'000;
  int64_t linger_ms = 1'000;          // reading and dropping input after a final answer
  size_t max_connections = 4096;      // more are accepted and closed at once
  size_t max_pipelined = 32;          // parsed requests waiting; reading pauses beyond
  std::string server_name = "wsup";   // the Server header
  // What a peer's EOF (its FIN) means while one of its requests is being
  // answered or waits to be. false (the default): the client is gone. The
  // connection is closed at once and the current writer's OnClose() runs, so
  // the proxy stops its upstream request and the engine its generation;
  // requests queued behind it are dropped unanswered. This is what
  // production proxies do: nginx ends the upstream request when the client
  // closes (unless proxy_ignore_client_abort is on), HAProxy with
  // `option abortonclose`. HTTP/1.1 lets a client half-close and still read
  // its answers, but HTTP clients do not do it, and a closed socket cannot be
  // told from a half-closed one by its FIN alone: without this, a client
  // that hung up on a long non-streamed completion kept an engine generating
  // for nobody (only a stream learns of it, when a write fails).
  // true: a half-closed peer is still answered (requests in flight and
  // queued complete; the connection closes after the last answer).
  bool serve_half_closed = false;
};

class Connection;

// One request's answer. Exactly one of Send() or StartStream()...End() is
// used. Once the connection is gone (peer closed, timeout, server closed),
// alive() is false and every call is a no-op; OnClose() callbacks run then.
class ResponseWriter {
 public:
  const HttpRequest& request() const { return request_; }
  bool alive() const { return conn_ != nullptr; }
  bool started() const { return started_; }
  bool finished() const { return finished_; }
  // The status of the answer's head (Send or StartStream), 0 before one:
  // set even when the connection is gone, as what the server chose to answer.
  int status() const { return status_; }

  // A complete response (Content-Length framing).
  void Send(HttpResponse response);
  // Starts a streamed response: chunked for HTTP/1.1; for HTTP/1.0 the body
  // runs until the connection closes.
  void StartStream(int status, std::vector<Header> headers);
  void Write(std::string_view data);
  void End();
  // Closes the connection at once without completing the response, so the
  // peer sees a cut-off answer rather than a complete one (a proxy whose
  // upstream died mid-response). OnClose() callbacks do not run.
  void Abort();

  // Response bytes handed to the socket that the peer has not taken yet.
  size_t queued_bytes() const;
  // Runs once if the connection closes before End()/Send() completes, or at
  // any later close while this writer is current.
  void OnClose(std::function<void()> cb) { on_close_ = std::move(cb); }

  // Internal: used by Connection.
  ResponseWriter(Connection* conn, HttpRequest request) : conn_(conn), request_(std::move(request)) {}
  void Detach();

 private:
  std::vector<Header> FramingHeaders(bool chunked, size_t content_length, bool have_length);

  Connection* conn_;
  HttpRequest request_;
  bool started_ = false;
  bool finished_ = false;
  bool chunked_ = false;
  int status_ = 0;
  std::function<void()> on_close_;
};

class HttpServer {
 public:
  using Handler = std::function<void(std::shared_ptr<ResponseWriter>)>;

  HttpServer(uv_loop_t* loop, ServerOptions options, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds options.host:options.port and starts accepting.
  Status Listen();
  // Starts accepting on a listening socket someone else bound (a supervisor
  // that keeps the socket across restarts). Takes ownership of fd.
  Status Adopt(int fd);
  // Serves a connection accepted elsewhere (the front's acceptor hands them
  // to its loops). Takes ownership of fd; a server that is closing or full
  // closes it at once.
  void AdoptConnection(int fd);
  int port() const { return port_; }
  const std::string& host() const { return options_.host; }
  const ServerOptions& options() const { return options_; }

  // Stops accepting and closes every connection; `done` runs on the loop
  // once the last handle's close callback has run. Safe to call twice.
  void Close(std::function<void()> done = {});
  size_t connection_count() const { return connections_.size(); }

  // Internal: used by Connection.
  uv_loop_t* loop() const { return loop_; }
  void Dispatch(std::shared_ptr<ResponseWriter> writer) { handler_(std::move(writer)); }
  void Forget(Connection* c);
  void MaybeDone() { close_.Check(); }
  std::string NextRequestId();

 private:
  static void OnConnection(uv_stream_t* server, int status);
  Status StartAccepting();

  uv_loop_t* loop_;
  ServerOptions options_;
  Handler handler_;
  uv_tcp_t* listener_ = nullptr;  // freed in its close callback
  int port_ = 0;
  bool listener_closed_ = true;
  std::unordered_set<Connection*> connections_;
  // Done once the listener and every connection are closed.
  CloseLatch close_{[this] { return listener_closed_ && connections_.empty(); }};
  uint64_t request_counter_ = 0;
  uint64_t id_salt_ = 0;
};

}  // namespace wsup::http
