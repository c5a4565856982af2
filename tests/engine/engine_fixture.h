// Support for the engine tests: real wsup-engine (and wsup-holder)
// processes come from testkit/engine_process.h (started on --port 0 with a
// ready fd, so a test learns the port and that the engine is ready without
// polling a port or sleeping); here, the test checkpoints' golden cases and
// requests to a running engine.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "testkit/engine_process.h"
#include "testkit/http_client.h"
#include "testkit/test_util.h"

namespace wsup::test {

// The engine tests' name for testkit's started-and-ready process.
using Proc = ReadyProcess;

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

// The engine's 16-token greedy completions of the golden prompts of model
// (a test checkpoint's name), in the golden file's order; compare with
// GoldenOutputs(model).
inline std::vector<std::vector<int>> AllOutputs(int port, const std::string& model) {
  std::vector<std::vector<int>> out;
  for (const auto& c : GoldenCases(model)) out.push_back(Complete(port, c.prompt, 16));
  return out;
}

// The golden outputs of model, in the golden file's order.
inline std::vector<std::vector<int>> GoldenOutputs(const std::string& model) {
  std::vector<std::vector<int>> out;
  for (const auto& c : GoldenCases(model)) out.push_back(c.output_ids);
  return out;
}

// Opens `streams` concurrent streamed completions of model's golden prompts
// (in turn) on the engine at port, checks that /health answers within 2 s
// while they run, then that every stream's token ids are its golden's.
inline void CheckConcurrentStreams(int port, const std::string& model, size_t streams) {
  using namespace std::chrono_literals;
  auto cases = GoldenCases(model);
  REQUIRE(!cases.empty());
  std::vector<HttpConn> conns(streams);
  for (size_t i = 0; i < conns.size(); ++i) {
    const auto& c = cases[i % cases.size()];
    nlohmann::json req = {{"prompt", c.prompt}, {"max_tokens", 16}, {"stream", true}, {"return_token_ids", true}};
    REQUIRE(conns[i].Connect(port));
    REQUIRE(conns[i].Send(FormatRequest("POST", "/v1/completions", req.dump())));
  }
  auto t0 = std::chrono::steady_clock::now();
  HttpResult h = HttpRequestOnce(port, "GET", "/health", "", 2s);
  CHECK(h.status == 200);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  for (size_t i = 0; i < conns.size(); ++i) {
    HttpResult r = conns[i].Read(60s);
    INFO("stream " << i << ": " << r.error << " body: " << r.body.substr(0, 300));
    REQUIRE(r.status == 200);
    std::vector<int> ids;
    for (const auto& ev : SseData(r.body)) {
      if (ev == "[DONE]") continue;
      nlohmann::json j = nlohmann::json::parse(ev);  // named: a temporary would die before the loop below
      for (int t : j["choices"][0]["token_ids"]) ids.push_back(t);
    }
    CHECK(ids == cases[i % cases.size()].output_ids);
  }
}

// wsup-engine on model_dir (a checkpoint folder) with `flags` refuses them
// as a usage error (exit 2), its output naming `says`.
inline void CheckUsageError(const std::string& model_dir, const std::vector<std::string>& flags,
                            const std::string& says) {
  std::vector<std::string> argv = {BinPath("wsup-engine"), "--model", model_dir, "--port", "0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto r = Run(argv, std::chrono::seconds(30));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find(says) != std::string::npos);
}

// A POST with a JSON body that must be answered `want`; the answer's JSON.
inline nlohmann::json PostJson(int port, const std::string& path, const nlohmann::json& body, int want = 200) {
  HttpResult r = HttpRequestOnce(port, "POST", path, body.dump(), std::chrono::seconds(60));
  INFO(path << " " << body.dump().substr(0, 300) << " -> " << r.status << " " << r.error << " "
            << r.body.substr(0, 400));
  REQUIRE(r.status == want);
  return nlohmann::json::parse(r.body);
}

inline nlohmann::json GetJson(int port, const std::string& path) {
  HttpResult r = HttpRequestOnce(port, "GET", path);
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  return j.is_discarded() ? nlohmann::json() : j;
}

}  // namespace wsup::test
