// Test helpers for the front: a wsup-front child process on port 0 with its
// own control socket, and a blocking control-socket client that keeps the
// events the front pushes apart from the replies.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace wsup::test {

class ControlClient {
 public:
  ControlClient() = default;
  ~ControlClient();
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  bool Connect(const std::string& path);
  bool SendRaw(std::string_view bytes);
  bool Send(const nlohmann::json& msg);
  // The next message that is not an event (events are kept in events()).
  std::optional<nlohmann::json> Reply(std::chrono::milliseconds limit = std::chrono::seconds(5));
  std::optional<nlohmann::json> Call(const nlohmann::json& msg);
  // An event of this kind (already received or arriving within limit);
  // with `field`, only one whose field equals `value`.
  std::optional<nlohmann::json> WaitEvent(const std::string& kind, const std::string& field = "",
                                          const std::string& value = "",
                                          std::chrono::milliseconds limit = std::chrono::seconds(5));
  // True once the front closed this connection.
  bool WaitClosed(std::chrono::milliseconds limit = std::chrono::seconds(5));
  const std::vector<nlohmann::json>& events() const { return events_; }

 private:
  // One framed message, or nullopt on timeout/EOF.
  std::optional<nlohmann::json> ReadMessage(std::chrono::steady_clock::time_point deadline);
  bool Fill(size_t n, std::chrono::steady_clock::time_point deadline);
  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
  std::vector<nlohmann::json> events_;
};

// set_routes as JSON; empty strings become null.
nlohmann::json SetRoutes(const std::string& active, const std::string& standby, int64_t epoch);

class FrontProcess {
 public:
  // Starts build/bin/wsup-front on 127.0.0.1:0 with a control socket in a
  // temporary directory; `args` are added. Fails the test if it does not
  // report its port in time.
  static std::unique_ptr<FrontProcess> Start(const std::vector<std::string>& args,
                                              const std::vector<int>& extra_fds = {});
  int port() const { return port_; }
  const std::string& control_path() const { return control_; }
  std::string Log() const { return ReadAll(log_); }
  Child& child() { return child_; }

 private:
  TempDir dir_;
  Child child_;
  std::string control_;
  std::string log_;
  int port_ = 0;
};

// A TCP port on 127.0.0.1 that refuses connections: bound, never listening,
// and kept bound (so nobody else takes it) while this object lives.
class RefusingPort {
 public:
  RefusingPort();
  ~RefusingPort();
  int port() const { return port_; }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace wsup::test
