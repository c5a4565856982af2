// ControlServer: the front's Unix control socket. The supervisor connects
// here to set routes and read status, and receives the events the front
// pushes (switched, first_ok); `wsup status` connects the same way. Several
// clients may be connected at once; events go to all of them.
//
// Each message is framed by control_frame.h. A client that sends a bad
// frame (zero or oversized length) gets one error reply and is dropped; a
// frame whose body is not a JSON object, or a message the handler refuses,
// gets an error reply and the client stays. A client that does not read its
// replies and events is dropped once kMaxQueuedBytes pile up. Nothing a
// client sends affects the others.
//
// The socket file is created with mode 0600 (umask around bind), so only
// the front's user can steer it. A stale socket file (nothing accepts on
// it) is replaced; a live one is refused, so two fronts never share a path.
//
// Ownership: the ControlServer owns its listening pipe and every client;
// each is freed in its close callback. Close() closes all and runs `done`
// once the last close callback has run.
// Threads: the loop thread only.
#pragma once

#include <uv.h>

#include <functional>
#include <string>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup::front {

class ControlServer {
 public:
  // Returns the reply to one request; it is sent back to that client only.
  using Handler = std::function<nlohmann::json(const nlohmann::json& request)>;

  static constexpr size_t kMaxClients = 64;
  static constexpr size_t kMaxQueuedBytes = 1 << 20;

  ControlServer(uv_loop_t* loop, std::string path, Handler handler);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  Status Listen();
  // Sends msg to every connected client.
  void Broadcast(const nlohmann::json& msg);
  void Close(std::function<void()> done = {});

  const std::string& path() const { return path_; }
  size_t client_count() const { return clients_.size(); }

  // Internal: used by the client connections.
  class Client;
  void Forget(Client* c);
  void MaybeDone();
  nlohmann::json Handle(const nlohmann::json& request) { return handler_(request); }

 private:
  static void OnConnection(uv_stream_t* server, int status);

  uv_loop_t* loop_;
  std::string path_;
  Handler handler_;
  uv_pipe_t* listener_ = nullptr;  // freed in its close callback
  bool listener_closed_ = true;
  bool closing_ = false;
  bool unlink_on_close_ = false;
  std::function<void()> done_;
  std::unordered_set<Client*> clients_;
};

}  // namespace wsup::front
