// JSON messages over Unix stream sockets on a libuv loop: the one
// connection and server behind the supervisor's control socket (for the
// `wsup` CLI), its link to the front (client side), and the front's own
// control socket. Frames are wire/json_frame.h's: a 4-byte little-endian
// length and one JSON object, bounded in size before anything is buffered.
//
// JsonConn: one connection. Messages are delivered in order to on_message.
// A bad length prefix ends the connection (the peer's framing cannot be
// trusted after it); so does a body that is not a JSON object, unless the
// options answer bad messages: then a bad body gets an error reply and the
// peer stays, and a bad prefix gets one error reply before the connection
// closes. Replies may be sent later (deferred), as long as the connection
// is alive: hold a shared_ptr and check alive(). With max_queued_bytes, a
// peer that does not read what is sent to it is dropped once that much is
// waiting, so it cannot make this process buffer without bound.
//
// JsonServer: listens on a path (socket file mode 0600, set by the umask
// around bind so there is no window with another mode; a stale file is
// replaced, a live one refused, so two servers never share a path), accepts
// up to max_clients connections, and, with same_uid_only, checks the peer's
// uid (SO_PEERCRED) against ours and refuses others. A refused peer gets an
// error reply saying why, then the connection closes.
//
// Each owner words its refusals (JsonServerWords: the socket's name and the
// fix, such as a flag or a config key) and shapes its error replies; the
// defaults are those of the node's control socket (`wsup.sock`, under
// node.runtime_dir).
//
// Ownership: each JsonConn owns its uv_pipe_t, freed in the close callback;
// the server owns its listener and holds its connections until they close.
// A server may be destroyed with handles still closing (their callbacks do
// not touch it); Close(done) runs done once every one of them has closed.
// Loop thread only.
#pragma once

#include <sys/types.h>
#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "wire/json_frame.h"

namespace wsup {

// {"type":"error","message":...}: the error reply of the node's control
// socket, and the default.
nlohmann::json TypedErrorReply(const std::string& message);

struct JsonConnOptions {
  // The frames' bounds and words (the holder protocol's words, 1 MiB).
  FrameDialect frames = FrameDialect{.max_bytes = 1u << 20};
  // Bytes waiting to be written after which the peer is dropped; 0: no bound.
  size_t max_queued_bytes = 0;
  // Reply to a bad message (see above) instead of closing at once.
  bool answer_bad_messages = false;
  nlohmann::json (*error_reply)(const std::string& message) = &TypedErrorReply;
  // Prefix of the warnings logged when a peer is dropped or refused (for
  // example "control"); empty: nothing is logged.
  std::string log_name;
};

class JsonConn : public std::enable_shared_from_this<JsonConn> {
 public:
  using MessageFn = std::function<void(const std::shared_ptr<JsonConn>&, const nlohmann::json&)>;
  using CloseFn = std::function<void(const std::string& why)>;

  // Connects to path; cb gets the connection or the error. Bounded by the
  // kernel: a Unix connect either succeeds or fails at once.
  static void Connect(uv_loop_t* loop, const std::string& path, uint32_t max_bytes,
                      std::function<void(Result<std::shared_ptr<JsonConn>>)> cb);

  JsonConn(uv_loop_t* loop, uint32_t max_bytes);
  JsonConn(uv_loop_t* loop, JsonConnOptions options, std::string where = "");
  ~JsonConn();
  JsonConn(const JsonConn&) = delete;
  JsonConn& operator=(const JsonConn&) = delete;

  void Start(MessageFn on_message, CloseFn on_close);
  void Send(const nlohmann::json& msg);
  // Sends a last message, then closes once everything queued is written.
  void SendAndClose(const nlohmann::json& msg, const std::string& why);
  void Close(const std::string& why = "closed");
  bool alive() const { return pipe_ != nullptr && !closing_; }
  uv_pipe_t* pipe() { return pipe_; }
  uid_t peer_uid() const { return peer_uid_; }
  pid_t peer_pid() const { return peer_pid_; }
  void ReadPeerCred();

 private:
  friend class JsonServer;
  static void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf);
  void OnData(const char* data, size_t len);
  // A bad message ends the connection: with an error reply when answering.
  void Refuse(const std::string& why);
  // Keeps this alive until the handle's close callback: from Start(), the
  // first Send() or Close(), whichever comes first.
  void Hold();
  JsonConnOptions options_;
  std::string where_;  // the server's path, for logs
  uv_pipe_t* pipe_;
  FrameDecoder decoder_;
  MessageFn on_message_;
  CloseFn on_close_;
  bool closing_ = false;
  bool closing_after_write_ = false;
  std::string close_why_;  // for the close after the last write
  size_t queued_bytes_ = 0;
  uid_t peer_uid_ = static_cast<uid_t>(-1);
  pid_t peer_pid_ = 0;
  std::function<void()> on_handle_closed_;  // the server's count of open handles
  std::shared_ptr<JsonConn> self_;          // see Hold()
};

// The words of a server's refusals. "{path}" stands for the socket's path,
// "{why}" for the system's reason, "{uid}" for ours and "{max}" for the
// longest path a Unix socket takes.
struct JsonServerWords {
  // Empty: the length of the path is left to bind to refuse.
  std::string path_too_long;
  std::string not_a_socket = "{path}: exists and is not a socket; remove it or choose another runtime_dir";
  std::string in_use =
      "{path}: another process is serving this socket (is a supervisor already running? see `wsup status`)";
  std::string cannot_listen = "{path}: cannot listen: {why}";
  std::string foreign_uid = "refused: this control socket accepts only uid {uid}; run wsup as that user";
  std::string too_many_clients = "too many control clients; try again";
};

struct JsonServerOptions {
  JsonConnOptions conn;
  size_t max_clients = 64;
  bool same_uid_only = true;
  int backlog = 64;
  JsonServerWords words;
};

class JsonServer {
 public:
  using Handler = std::function<void(const std::shared_ptr<JsonConn>&, const nlohmann::json&)>;

  JsonServer(uv_loop_t* loop, std::string path, Handler handler, size_t max_clients = 64,
             uint32_t max_bytes = 1 << 20);
  JsonServer(uv_loop_t* loop, std::string path, Handler handler, JsonServerOptions options);
  ~JsonServer();
  JsonServer(const JsonServer&) = delete;
  JsonServer& operator=(const JsonServer&) = delete;

  Status Listen();
  // Sends msg to every connected client.
  void Broadcast(const nlohmann::json& msg);
  // Closes the listener (removing the socket file) and every connection;
  // `done` runs once all of their handles have closed.
  void Close(std::function<void()> done = {});
  const std::string& path() const { return path_; }
  size_t client_count() const { return conns_.size(); }

 private:
  struct Handles;  // open handles and `done`, shared with their close callbacks
  static void OnConnection(uv_stream_t* s, int status);
  std::string Words(const std::string& words, const std::string& why = "") const;
  uv_loop_t* loop_;
  std::string path_;
  Handler handler_;
  JsonServerOptions options_;
  uv_pipe_t* listener_ = nullptr;
  std::shared_ptr<Handles> handles_;
  std::unordered_set<std::shared_ptr<JsonConn>> conns_;
};

}  // namespace wsup
