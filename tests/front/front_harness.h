// Test helpers for the front: a wsup-front child process on port 0 with its
// own control socket (spoken to with testkit/control_client.h), and a port
// that refuses connections.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "testkit/control_client.h"
#include "testkit/test_util.h"

namespace wsup::test {

// A control reply, or an empty object when none came (the test then fails
// on the fields it reads).
inline nlohmann::json ReplyOr(const Result<nlohmann::json>& r) { return r.ok() ? *r : nlohmann::json::object(); }

// The front's status over its control socket; the test stops unless it
// answers {"ok": true, ...}.
nlohmann::json FrontStatus(ControlClient& ctl);

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
