// Real wsup-engine (and wsup-holder) processes for the engine tests:
// started on --port 0 with a ready fd, so a test learns the port and that
// the engine is ready without polling a port or sleeping.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "testkit/http_client.h"
#include "testkit/test_util.h"

namespace wsup::test {

// Reads one line from fd within limit; nullopt on EOF or timeout.
inline std::optional<std::string> ReadLine(int fd, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  std::string line;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) != 1) return std::nullopt;
    char c;
    ssize_t n = ::read(fd, &c, 1);
    if (n <= 0) return std::nullopt;
    if (c == '\n') return line;
    line.push_back(c);
  }
}

struct Proc {
  Child child;
  int port = 0;
  std::string log;
  std::string ready_line;
  bool ready = false;
  std::string Log() const { return ReadAll(log); }
};

// Starts argv with fd 3 as its ready fd ("--ready-fd 3" must be in argv).
inline Proc StartWithReadyFd(const std::vector<std::string>& argv, const std::string& log,
                             std::chrono::milliseconds limit = std::chrono::seconds(60)) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) std::abort();
  Proc p;
  p.log = log;
  p.child = Child::Start(argv, log, {fds[1]});
  ::close(fds[1]);
  auto line = ReadLine(fds[0], limit);
  ::close(fds[0]);
  if (line) {
    p.ready = true;
    p.ready_line = *line;
    auto colon = line->rfind(':');
    if (line->rfind("listening on ", 0) == 0 && colon != std::string::npos) p.port = std::atoi(line->c_str() + colon + 1);
  }
  return p;
}

inline Proc StartEngine(const TempDir& dir, const std::string& model, std::vector<std::string> extra = {},
                        const std::string& log_name = "engine.log") {
  std::vector<std::string> argv = {BinPath("wsup-engine"), "--model", TestData(model), "--port", "0",
                                   "--ready-fd", "3", "--log-level", "warn"};
  // A small cache keeps startup fast; a test may ask for another size.
  if (std::find(extra.begin(), extra.end(), "--kv-cache-mib") == extra.end()) {
    argv.insert(argv.end(), {"--kv-cache-mib", "4"});
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return StartWithReadyFd(argv, dir.Join(log_name));
}

inline Proc StartHolder(const TempDir& dir, const std::string& model_dir, const std::string& socket,
                        std::vector<std::string> extra = {}, const std::string& log_name = "holder.log") {
  std::vector<std::string> argv = {BinPath("wsup-holder"), "--model", model_dir, "--socket", socket,
                                   "--backend", "host", "--ready-fd", "3", "--log-level", "warn"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return StartWithReadyFd(argv, dir.Join(log_name));
}

struct GoldenCase {
  std::string prompt;
  std::vector<int> prompt_ids, output_ids;
};

inline std::vector<GoldenCase> GoldenCases(const std::string& model) {
  auto text = ReadFile(TestData(model) + "/golden.json");
  std::vector<GoldenCase> out;
  if (!text.ok()) return out;
  auto j = nlohmann::json::parse(*text);
  for (const auto& c : j["cases"]) {
    out.push_back({c["prompt"], c["prompt_ids"].get<std::vector<int>>(), c["output_ids"].get<std::vector<int>>()});
  }
  return out;
}

// A greedy completion; returns the token ids, or {} with the failure in *err.
inline std::vector<int> Complete(int port, const std::string& prompt, int max_tokens, std::string* err = nullptr) {
  nlohmann::json req = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"return_token_ids", true}};
  HttpResult r = HttpRequestOnce(port, "POST", "/v1/completions", req.dump());
  if (r.status != 200) {
    if (err) *err = std::to_string(r.status) + " " + r.error + " " + r.body;
    return {};
  }
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded()) return {};
  return j["choices"][0]["token_ids"].get<std::vector<int>>();
}

inline nlohmann::json GetJson(int port, const std::string& path) {
  HttpResult r = HttpRequestOnce(port, "GET", path);
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  return j.is_discarded() ? nlohmann::json() : j;
}

}  // namespace wsup::test
