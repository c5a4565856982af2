// JSON messages over Unix stream sockets on a libuv loop: the supervisor's
// control socket (server side, for the `wsup` CLI) and its link to the
// front's control socket (client side). Frames are the holder protocol's
// (wire/protocol.h): a 4-byte little-endian length and one JSON object,
// bounded in size before anything is buffered.
//
// JsonConn: one connection. Messages are delivered in order to on_message;
// a bad frame closes the connection (the peer's framing cannot be trusted
// after it). Replies may be sent later (deferred), as long as the
// connection is alive: hold a shared_ptr and check alive().
//
// JsonServer: listens on a path (socket file mode 0600; a stale file is
// replaced, a live one refused), accepts up to max_clients connections,
// checks the peer's uid (SO_PEERCRED) against ours and refuses others.
//
// Ownership: each JsonConn owns its uv_pipe_t, freed in the close callback;
// the server owns its listener and holds its connections until they close.
// Loop thread only.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "wire/protocol.h"

namespace wsup {

class JsonConn : public std::enable_shared_from_this<JsonConn> {
 public:
  using MessageFn = std::function<void(const std::shared_ptr<JsonConn>&, const nlohmann::json&)>;
  using CloseFn = std::function<void(const std::string& why)>;

  // Connects to path; cb gets the connection or the error. Bounded by the
  // kernel: a Unix connect either succeeds or fails at once.
  static void Connect(uv_loop_t* loop, const std::string& path, uint32_t max_bytes,
                      std::function<void(Result<std::shared_ptr<JsonConn>>)> cb);

  JsonConn(uv_loop_t* loop, uint32_t max_bytes);
  ~JsonConn();

  void Start(MessageFn on_message, CloseFn on_close);
  void Send(const nlohmann::json& msg);
  void Close(const std::string& why = "closed");
  bool alive() const { return pipe_ != nullptr && !closing_; }
  uv_pipe_t* pipe() { return pipe_; }
  uid_t peer_uid() const { return peer_uid_; }
  pid_t peer_pid() const { return peer_pid_; }
  void ReadPeerCred();

 private:
  static void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf);
  uv_pipe_t* pipe_;
  FrameDecoder decoder_;
  MessageFn on_message_;
  CloseFn on_close_;
  bool closing_ = false;
  uid_t peer_uid_ = static_cast<uid_t>(-1);
  pid_t peer_pid_ = 0;
  std::shared_ptr<JsonConn> self_;  // keeps this alive while the pipe is open
};

class JsonServer {
 public:
  using Handler = std::function<void(const std::shared_ptr<JsonConn>&, const nlohmann::json&)>;

  JsonServer(uv_loop_t* loop, std::string path, Handler handler, size_t max_clients = 64,
             uint32_t max_bytes = 1 << 20);
  ~JsonServer();
  Status Listen();
  void Close();
  const std::string& path() const { return path_; }

 private:
  static void OnConnection(uv_stream_t* s, int status);
  uv_loop_t* loop_;
  std::string path_;
  Handler handler_;
  size_t max_clients_;
  uint32_t max_bytes_;
  uv_pipe_t* listener_ = nullptr;
  std::unordered_set<std::shared_ptr<JsonConn>> conns_;
};

// A blocking request/reply on a control socket, for CLI commands: connect,
// send, wait for the first reply (bounded by timeout_ms).
Result<nlohmann::json> JsonCall(const std::string& path, const nlohmann::json& request, int timeout_ms);

}  // namespace wsup
