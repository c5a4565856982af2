// Real wsup-engine and wsup-holder processes for tests and benchmarks,
// started with a ready fd (--ready-fd), so the caller learns that the
// program is up, and an engine's port, from the line it writes there: no
// polling of a port, no sleeping.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "testkit/test_util.h"

namespace wsup::test {

// One line from fd within limit (without its newline); nullopt on EOF or
// timeout.
std::optional<std::string> ReadLine(int fd, std::chrono::milliseconds limit);

struct ReadyProcess {
  Child child;
  bool ready = false;      // the ready line came in time
  std::string ready_line;  // "listening on 127.0.0.1:PORT" (an engine), "ready SOCKET" (a holder)
  int port = 0;            // an engine's port, from its ready line
  std::string log;
  std::string Log() const { return ReadAll(log); }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port); }
};

// Starts argv with fd 3 as its ready fd ("--ready-fd", "3" must be in argv)
// and waits for the line within limit.
ReadyProcess StartWithReadyFd(const std::vector<std::string>& argv, const std::string& log,
                              std::chrono::milliseconds limit = std::chrono::seconds(60));

// wsup-engine on a test checkpoint (`model`: its name), on port 0, logging
// warnings only, with a small KV cache unless `extra` says --kv-cache-mib;
// `extra` comes last. Its log is dir/log_name.
ReadyProcess StartEngine(const TempDir& dir, const std::string& model, std::vector<std::string> extra = {},
                         const std::string& log_name = "engine.log",
                         std::chrono::milliseconds limit = std::chrono::seconds(60));

// wsup-holder (host backend) of model_dir on `socket`; `extra` comes last.
ReadyProcess StartHolder(const TempDir& dir, const std::string& model_dir, const std::string& socket,
                         std::vector<std::string> extra = {}, const std::string& log_name = "holder.log");

}  // namespace wsup::test
