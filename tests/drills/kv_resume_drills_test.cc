// Streams cut by an engine's death resume from its KV pages (the KV
// journal, docs/kv_journal.md) on a real node: config/demo.toml with its
// pool, the engines paced at 20 ms a step so that a 48-token stream can be
// cut after 8 tokens. One node, three kills in turn:
//   1. one stream of a 400-token prompt, SIGKILLed after 8 of 48 tokens:
//      the client gets exactly an uninterrupted run's tokens, and the
//      promoted engine adopted at least the prompt's 400 positions;
//   2. twenty such streams at once: all identical, all twenty adopted;
//   3. a journal damaged on purpose while the engine is stopped (a wrong
//      hash, a page out of the pool, a torn entry; a fourth left intact):
//      all identical, the three computed again and counted by reason.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "http/client.h"
#include "tests/drills/drill_node.h"
#include "testkit/test_util.h"
#include "wire/kv_journal.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr int kPromptTokens = 400;
constexpr size_t kMaxTokens = 48;
constexpr size_t kCutAfter = 8;
constexpr int64_t kPoolMib = 32;  // twenty streams of 448 positions, 16 per 32 KiB block

std::vector<int> Prompt(int salt) {
  std::vector<int> p(kPromptTokens);
  for (int i = 0; i < kPromptTokens; ++i) p[static_cast<size_t>(i)] = (i * 37 + salt * 11 + 3) % 256;
  return p;
}

// Streamed completions through the front, all sent at once, on a loop
// thread of their own; each with the request id the test gives it.
class Streams {
 public:
  Streams(int port, const std::vector<std::pair<std::string, std::vector<int>>>& reqs) : n_(reqs.size()) {
    tokens_.resize(n_);
    finish_.resize(n_);
    error_.resize(n_);
    done_.assign(n_, false);
    uv_loop_init(&loop_);
    client_ = std::make_unique<http::HttpClient>(&loop_);
    for (size_t i = 0; i < n_; ++i) {
      http::ClientRequest r;
      r.method = "POST";
      r.target = "/v1/completions";
      r.headers = {{"Content-Type", "application/json"}, {"X-Request-Id", reqs[i].first}};
      r.body = json{
          {"prompt", reqs[i].second},
          {"max_tokens", kMaxTokens},
          {"stream", true},
          {"return_token_ids",
           true}}.dump();
      r.timeout_ms = 150'000;
      r.on_event = [this, i](const http::ServerSentEvent& e) {
        if (e.data == "[DONE]") return;
        json j = json::parse(e.data, nullptr, false);
        if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) return;
        const json& c = j["choices"][0];
        std::lock_guard<std::mutex> lk(mu_);
        for (const auto& t : c.value("token_ids", json::array())) tokens_[i].push_back(t.get<int>());
        if (c.contains("finish_reason") && c["finish_reason"].is_string()) finish_[i] = c["finish_reason"];
      };
      client_->Send("127.0.0.1", port, std::move(r), [this, i](Result<http::HttpResponse> res) {
        std::lock_guard<std::mutex> lk(mu_);
        done_[i] = true;
        if (!res.ok()) {
          error_[i] = res.error().message();
        } else if (res->status != 200) {
          error_[i] = "status " + std::to_string(res->status) + ": " + res->body;
        }
      });
    }
    thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
  }
  ~Streams() {
    thread_.join();  // every request ends within its timeout
    client_.reset();
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
  }
  size_t MinTokens() {
    std::lock_guard<std::mutex> lk(mu_);
    size_t m = SIZE_MAX;
    for (const auto& t : tokens_) m = std::min(m, t.size());
    return m;
  }
  std::vector<size_t> Counts() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<size_t> c;
    for (const auto& t : tokens_) c.push_back(t.size());
    return c;
  }
  bool WaitDone() {
    return test::WaitFor(
        [&] {
          std::lock_guard<std::mutex> lk(mu_);
          return std::all_of(done_.begin(), done_.end(), [](bool d) { return d; });
        },
        160s);
  }
  std::vector<int> Tokens(size_t i) {
    std::lock_guard<std::mutex> lk(mu_);
    return tokens_[i];
  }
  std::string Error(size_t i) {
    std::lock_guard<std::mutex> lk(mu_);
    return error_[i];
  }
  std::string Finish(size_t i) {
    std::lock_guard<std::mutex> lk(mu_);
    return finish_[i];
  }

 private:
  size_t n_;
  uv_loop_t loop_;
  std::unique_ptr<http::HttpClient> client_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::vector<int>> tokens_;
  std::vector<std::string> finish_, error_;
  std::vector<bool> done_;
};

// GET path on 127.0.0.1:port (with a control token, when given): the body
// of a 200, else "".
std::string Get(int port, const std::string& path, const std::string& token = "") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  std::string out;
  {
    http::HttpClient client(&loop);
    http::ClientRequest r;
    r.target = path;
    r.timeout_ms = 10'000;
    if (!token.empty()) r.headers.push_back({"Authorization", "Bearer " + token});
    client.Send("127.0.0.1", port, std::move(r), [&](Result<http::HttpResponse> res) {
      if (res.ok() && res->status == 200) out = res->body;
    });
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  return out;
}

// The GET /wsup/status of the node's engine of `slot`, with its control token.
json EngineStatus(const test::DrillNode& node, const json& engine) {
  return json::parse(Get(engine.value("port", 0), "/wsup/status", node.ControlToken(engine.value("slot", ""))),
                     nullptr, false);
}

// Serving, with the active engine on the pool and the standby ready.
bool Settled(const test::DrillNode& node, json* last) {
  return test::WaitFor(
      [&] {
        auto st = node.Status();
        if (!st) return false;
        *last = *st;
        json act = test::EngineOf(*st, "active"), stby = test::EngineOf(*st, "standby");
        return act.is_object() && stby.is_object() && act.value("semantic_ready", false) &&
               stby.value("semantic_ready", false) &&
               act.value("kv", json::object()).value("source", "") == "pool" &&
               (*st)["kv_pool"].value("owner", "") == act.value("slot", "");
      },
      120s);
}

// The node's KV pool as the rank-0 holder keeps it: its memfd, opened
// through /proc (the journal is at its start).
UniqueFd OpenPoolMemfd(const json& status) {
  for (const auto& h : status.value("holders", json::array())) {
    const int pid = h.value("pid", 0);
    if (h.value("rank", -1) != 0 || pid <= 0) continue;
    const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    DIR* d = ::opendir(dir.c_str());
    if (!d) continue;
    UniqueFd found;
    while (dirent* e = ::readdir(d)) {
      const std::string path = dir + "/" + e->d_name;
      char link[256] = {0};
      if (::readlink(path.c_str(), link, sizeof(link) - 1) <= 0 ||
          std::string(link).find("memfd:") == std::string::npos)
        continue;
      struct stat sb {};
      if (::stat(path.c_str(), &sb) != 0 || static_cast<int64_t>(sb.st_size) != (kPoolMib << 20)) continue;
      UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
      char magic[8] = {0};
      if (fd.valid() && ::pread(fd.get(), magic, 8, 0) == 8 && std::string(magic, 8) == "WSUPKVJ1") {
        found = std::move(fd);
        break;
      }
    }
    ::closedir(d);
    if (found.valid()) return found;
  }
  return UniqueFd();
}

// Runs the streams uncut (the answers to compare with).
std::vector<std::vector<int>> Uncut(int port,
                                    const std::vector<std::pair<std::string, std::vector<int>>>& reqs) {
  Streams s(port, reqs);
  REQUIRE(s.WaitDone());
  std::vector<std::vector<int>> out;
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO("uncut stream " << i << ": " << s.Error(i));
    REQUIRE(s.Error(i).empty());
    REQUIRE(s.Tokens(i).size() == kMaxTokens);
    out.push_back(s.Tokens(i));
  }
  return out;
}

struct Cut {
  json promoted;  // the promoted engine's /wsup/status "resume" once every stream ended
  std::vector<size_t> at_kill;
};

// The streams, their active engine killed once each has kCutAfter tokens
// (`before_kill` runs with the engine stopped, just before the SIGKILL);
// every stream must end with the uncut tokens.
Cut RunCut(test::DrillNode& node, const std::vector<std::pair<std::string, std::vector<int>>>& reqs,
           const std::vector<std::vector<int>>& want,
           const std::function<void(const json&)>& before_kill = {}) {
  json st;
  const bool settled = Settled(node, &st);
  INFO(st.dump(1));
  REQUIRE(settled);
  const json active = test::EngineOf(st, "active");
  const json standby = test::EngineOf(st, "standby");
  const int pid = active.value("pid", 0);
  REQUIRE(pid > 0);
  Cut cut;
  Streams s(node.FrontPort(), reqs);
  const bool started = test::WaitFor([&] { return s.MinTokens() >= kCutAfter; }, 120s);
  REQUIRE(started);
  if (before_kill) {
    REQUIRE(::kill(pid, SIGSTOP) == 0);
    before_kill(st);
  }
  REQUIRE(::kill(pid, SIGKILL) == 0);
  cut.at_kill = s.Counts();
  REQUIRE(s.WaitDone());
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO("stream " << reqs[i].first << ": " << cut.at_kill[i] << " tokens when its engine was killed; "
                   << s.Error(i));
    CHECK(s.Error(i).empty());
    CHECK(cut.at_kill[i] < kMaxTokens);  // cut in the middle
    CHECK(s.Tokens(i) == want[i]);
    CHECK(s.Finish(i) == "length");
  }
  json es = EngineStatus(node, standby);
  INFO(es.dump(1));
  REQUIRE(es.is_object());
  REQUIRE(es.contains("resume"));
  cut.promoted = es["resume"];
  return cut;
}

TEST_CASE("kv journal drills: streams cut by a crash resume from the dead engine's KV pages, token for token",
          "[drills][kv_journal]") {
  if (test::SkipWithout("llama-tiny-f32")) return;
  test::DrillNodeSpec spec;
  spec.kv_pool = true;
  // The step bound off (--max-step-ms 0): twenty 400-token prompts are
  // then prefilled in four steps and every stream is mid-way at the kill.
  // Bounded, a slow build prefills them over many paced steps, and the
  // first streams end before the last one has its first tokens.
  spec.engine_args = {"--min-step-ms", "20", "--max-step-ms", "0"};
  // Twenty 400-token prompts share the engine's steps with the probes for
  // seconds on a busy 2-core machine: a probe may time out then, and three
  // in a row would trip the healthy active engine under the test's kill.
  // This test is about the KV, not about probes under load.
  spec.sets = {"kv.pool_mib=" + std::to_string(kPoolMib), "probe.failures=30"};
  test::DrillNode node(spec);
  node.Start();
  INFO(node.Log());
  REQUIRE(node.WaitServing());
  const int port = node.FrontPort();
  REQUIRE(port > 0);

  // 1. One stream of a 400-token prompt.
  {
    std::vector<std::pair<std::string, std::vector<int>>> reqs = {{"kvj-one", Prompt(1)}};
    auto want = Uncut(port, {{"kvj-one-ref", Prompt(1)}});
    Cut c = RunCut(node, reqs, want);
    INFO(c.promoted.dump(1));
    CHECK(c.promoted.value("adopted_sequences", 0) == 1);
    CHECK(c.promoted.value("adopted_tokens", 0) >= kPromptTokens);
    CHECK(c.promoted.value("recomputed_sequences", -1) == 0);
    // The supervisor says so too: `wsup status` and /metrics, from the
    // engine's status it reads every second.
    json st;
    const bool reported = test::WaitFor(
        [&] {
          auto s = node.Status();
          if (!s) return false;
          st = *s;
          return test::EngineOf(st, "active").value("resume", json::object()).value("adopted_sequences", 0) == 1;
        },
        30s);
    INFO(st.dump(1));
    CHECK(reported);
    const std::string slot = test::EngineOf(st, "active").value("slot", "");
    const std::string admin = st.value("admin", "");
    const std::string metrics = Get(std::atoi(admin.c_str() + admin.rfind(':') + 1), "/metrics");
    INFO(metrics);
    CHECK(metrics.find("wsup_engine_resumed_streams_total{slot=\"" + slot + "\",kv=\"adopted\"} 1\n") !=
          std::string::npos);
    CHECK(metrics.find("wsup_engine_resumed_streams_total{slot=\"" + slot + "\",kv=\"recomputed\"} 0\n") !=
          std::string::npos);
    CHECK(metrics.find("wsup_engine_adopted_tokens_total{slot=\"" + slot + "\"} ") != std::string::npos);
  }
  // 2. Twenty at once.
  {
    std::vector<std::pair<std::string, std::vector<int>>> reqs, refs;
    for (int i = 0; i < 20; ++i) {
      reqs.push_back({"kvj-twenty-" + std::to_string(i), Prompt(100 + i)});
      refs.push_back({"kvj-twenty-ref-" + std::to_string(i), Prompt(100 + i)});
    }
    auto want = Uncut(port, refs);
    Cut c = RunCut(node, reqs, want);
    INFO(c.promoted.dump(1));
    CHECK(c.promoted.value("adopted_sequences", 0) == 20);
    CHECK(c.promoted.value("adopted_tokens", 0) >= 20 * kPromptTokens);
    CHECK(c.promoted.value("recomputed_sequences", -1) == 0);
  }
  // 3. A journal damaged on purpose.
  {
    const std::vector<std::string> ids = {"kvj-wrong-hash", "kvj-out-of-range", "kvj-torn", "kvj-intact"};
    std::vector<std::pair<std::string, std::vector<int>>> reqs, refs;
    for (size_t i = 0; i < ids.size(); ++i) {
      reqs.push_back({ids[i], Prompt(200 + static_cast<int>(i))});
      refs.push_back({ids[i] + "-ref", Prompt(200 + static_cast<int>(i))});
    }
    auto want = Uncut(port, refs);
    std::string damaged;
    Cut c = RunCut(node, reqs, want, [&](const json& st) {
      UniqueFd fd = OpenPoolMemfd(st);
      REQUIRE(fd.valid());
      std::vector<uint8_t> head(kKvJournalHeaderBytes);
      REQUIRE(::pread(fd.get(), head.data(), head.size(), 0) == static_cast<ssize_t>(head.size()));
      auto g = KvJournalGeometry::FromHeader(head.data(), head.size());
      REQUIRE(g.ok());
      std::vector<uint8_t> bytes(g->bytes());
      REQUIRE(::pread(fd.get(), bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
      KvJournalReader r = KvJournalReader::Read(bytes.data(), bytes.size(), *g);
      auto w = KvJournalWriter::Create(bytes.data(), *g);
      REQUIRE(w.ok());
      uint32_t slot = 0;
      for (const auto& id : ids) {
        auto e = r.entries().find(id);
        REQUIRE(e != r.entries().end());
        KvJournalEntry x = e->second;
        if (id == "kvj-wrong-hash") x.token_hash ^= 1;
        if (id == "kvj-out-of-range") x.pages.back() = g->pool_blocks + 5;
        REQUIRE(w->Put(id, x.token_hash, x.count, x.pages, x.chain).ok());
        if (id == "kvj-torn") bytes[kKvJournalHeaderBytes + g->entry_bytes() * slot] |= 1;  // its seq: odd
        ++slot;
      }
      REQUIRE(::pwrite(fd.get(), bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
      damaged = "yes";
    });
    REQUIRE(damaged == "yes");
    INFO(c.promoted.dump(1));
    CHECK(c.promoted.value("adopted_sequences", 0) == 1);
    CHECK(c.promoted.value("recomputed_sequences", 0) == 3);
    const json reasons = c.promoted.value("recomputed_reasons", json::object());
    CHECK(reasons.value("hash_mismatch", 0) == 1);
    CHECK(reasons.value("page_out_of_range", 0) == 1);
    CHECK(reasons.value("torn", 0) == 1);
  }
}

}  // namespace
}  // namespace wsup
