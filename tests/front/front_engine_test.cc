// End to end: the front between a client and two real engines
// (build/bin/wsup-engine serving the llama-tiny-f32 test checkpoint). The
// active engine is SIGKILLed in the middle of a greedy stream; the client's
// stream must equal the golden output of transformers exactly.
//
// A tiny model on a CPU writes all 16 tokens within a few milliseconds, so a
// kill "after the first token" would land anywhere, most often after the
// last one. To make the kill land mid-stream every time, the front reaches
// the active engine through a relay that passes the engine's first N events
// and holds the rest back; the engine is then SIGKILLed and the relay drops
// its connections (the port refuses from then on), which is what the front
// sees when an engine dies after N tokens.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/front/front_harness.h"
#include "testkit/engine_process.h"
#include "testkit/http_client.h"
#include "testkit/test_util.h"

using namespace std::chrono_literals;
using nlohmann::json;
using namespace wsup::test;  // the front's harness and the shared test support

namespace {

const char* kModel = "llama-tiny-f32";

using Engine = wsup::test::ReadyProcess;

// wsup-engine on port 0 (the engine's own 64 MiB cache), ready within two
// minutes (a loaded two-core machine) or the test stops.
Engine StartCpuEngine(const wsup::test::TempDir& dir, const std::string& name) {
  Engine e = wsup::test::StartEngine(dir, kModel, {"--weight-cache", "off", "--device", "cpu", "--kv-cache-mib", "64"},
                                     name + ".log", 120s);
  INFO(e.Log());
  REQUIRE(e.ready);
  REQUIRE(e.port > 0);
  return e;
}

// A TCP relay on 127.0.0.1:0 in front of one engine. Engine-to-front bytes
// pass until `pass_events` server-sent events went through; later bytes are
// held back. Cut() drops every connection and stops listening.
class HoldingRelay {
 public:
  HoldingRelay(int target_port, int pass_events) : target_(target_port), pass_(pass_events) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(listen_fd_, 16) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    REQUIRE(::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) == 0);
    thread_ = std::thread([this] { Loop(); });
  }
  ~HoldingRelay() {
    Cut();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  int port() const { return port_; }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
  int events_passed() const { return passed_.load(); }
  void Cut() {
    if (!thread_.joinable()) return;
    stop_ = true;
    (void)!::write(wake_[1], "x", 1);
    thread_.join();
  }

 private:
  struct Pair {
    int front = -1;
    int engine = -1;
  };

  void Loop() {
    std::vector<Pair> pairs;
    char last = 0, buf[16384];
    while (!stop_) {
      std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      for (const auto& p : pairs) {
        fds.push_back({p.front, POLLIN, 0});
        fds.push_back({p.engine, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 1000) <= 0) continue;
      // Only the pairs that were polled have revents; one accepted below
      // waits for the next round.
      const size_t polled = pairs.size();
      if (fds[1].revents & POLLIN) {
        int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) {
          int e = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          a.sin_port = htons(static_cast<uint16_t>(target_));
          if (::connect(e, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
            pairs.push_back({c, e});
          } else {
            ::close(c);
            ::close(e);
          }
        }
      }
      for (size_t i = 0; i < polled; ++i) {
        Pair& p = pairs[i];
        short front_ev = fds[2 + 2 * i].revents, engine_ev = fds[3 + 2 * i].revents;
        bool dead = false;
        if (front_ev & (POLLIN | POLLHUP | POLLERR)) {
          ssize_t n = ::recv(p.front, buf, sizeof(buf), 0);
          if (n <= 0 || ::send(p.engine, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) dead = true;
        }
        if (!dead && (engine_ev & (POLLIN | POLLHUP | POLLERR))) {
          ssize_t n = ::recv(p.engine, buf, sizeof(buf), 0);
          if (n <= 0) {
            dead = true;
          } else {
            // Forward up to the end of the pass_-th event; hold the rest.
            size_t upto = 0;
            while (upto < static_cast<size_t>(n) && passed_.load() < pass_) {
              if (buf[upto] == '\n' && last == '\n') ++passed_;
              last = buf[upto];
              ++upto;
            }
            if (passed_.load() < pass_) upto = static_cast<size_t>(n);
            if (upto > 0 && ::send(p.front, buf, upto, MSG_NOSIGNAL) != static_cast<ssize_t>(upto)) dead = true;
          }
        }
        if (dead) {
          ::close(p.front);
          ::close(p.engine);
          pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(i));
          break;  // the poll set no longer matches; poll again
        }
      }
    }
    for (auto& p : pairs) {
      ::close(p.front);
      ::close(p.engine);
    }
    ::close(listen_fd_);
  }

  int target_;
  int pass_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<int> passed_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

bool Prerequisites() {
  if (!wsup::test::HaveTestData(kModel) || !std::filesystem::exists(wsup::test::BinPath("wsup-engine"))) {
    WARN("skipped: needs " << wsup::test::TestData(kModel) << " and " << wsup::test::BinPath("wsup-engine"));
    return false;
  }
  return true;
}

json Golden() {
  std::ifstream in(wsup::test::TestData(kModel) + "/golden.json");
  return json::parse(in);
}

// Two CPU engines, a and b, on the test checkpoint, logging in dir, with
// its golden cases; StartFront() puts the front under test before them.
// Where the checkpoint or the engine is missing nothing starts and `ok` is
// false: the test returns at once.
struct TwoEngines {
  bool ok = Prerequisites();
  wsup::test::TempDir dir;
  json golden = ok ? Golden() : json();
  Engine a = ok ? StartCpuEngine(dir, "a") : Engine();
  Engine b = ok ? StartCpuEngine(dir, "b") : Engine();
  std::unique_ptr<FrontProcess> front;
  ControlClient ctl;

  // Starts the front with args and connects ctl to its control socket.
  void StartFront(const std::vector<std::string>& args) {
    front = FrontProcess::Start(args);
    REQUIRE(ctl.Connect(front->control_path()));
  }
  // POSTs req to the front's /v1/completions; 60 s at most.
  HttpResult Complete(const json& req) const {
    return wsup::test::HttpRequestOnce(front->port(), "POST", "/v1/completions", req.dump(), 60s);
  }
};

// A greedy completion of a golden case's prompt, 16 tokens.
json PlainRequest(const json& golden_case) { return {{"prompt", golden_case["prompt"]}, {"max_tokens", 16}}; }

// The same, streamed.
json StreamRequest(const json& golden_case) {
  return {{"prompt", golden_case["prompt"]}, {"max_tokens", 16}, {"stream", true}, {"temperature", 0}};
}

}  // namespace

TEST_CASE_METHOD(TwoEngines, "a stream survives a SIGKILL of the active engine and equals the golden output",
                             "[front][engine]") {
  if (!ok) return;
  HoldingRelay relay(a.port, 5);
  StartFront({"--active", relay.addr(), "--standby", b.addr()});

  const json& c = golden["cases"][0];
  json req = StreamRequest(c);
  HttpResult r;
  std::thread client([&] { r = Complete(req); });
  REQUIRE(WaitFor([&] { return relay.events_passed() >= 5; }, 60s));
  a.child.Kill(SIGKILL);
  REQUIRE(a.child.Wait(10s) >= 0);
  relay.Cut();
  client.join();

  REQUIRE(r.status == 200);
  std::string text;
  bool done = false;
  int events = 0;
  for (const auto& d : wsup::test::SseData(r.body)) {
    if (d == "[DONE]") {
      done = true;
      continue;
    }
    json e = json::parse(d);
    if (e["choices"].empty()) continue;
    CHECK_FALSE(e["choices"][0].contains("token_ids"));
    text += e["choices"][0]["text"].get<std::string>();
    ++events;
  }
  CHECK(done);
  CHECK(text == c["output_text_latin1"].get<std::string>());
  json st = wsup::test::ReplyOr(ctl.Call({{"type", "status"}}));
  CHECK(st["counters"]["resumed"] == 1);
  CHECK(st["counters"]["switched_self"] == 1);
  CHECK(st["active"] == b.addr());

  // With token ids asked for and given as the prompt, the ids match too.
  const json& c2 = golden["cases"][2];
  json req2 = {{"prompt", c2["prompt_ids"]}, {"max_tokens", 16}, {"stream", true}, {"return_token_ids", true}};
  r = Complete(req2);
  REQUIRE(r.status == 200);
  std::vector<int64_t> ids;
  for (const auto& d : wsup::test::SseData(r.body)) {
    if (d == "[DONE]") continue;
    json e = json::parse(d);
    if (e["choices"].empty()) continue;
    for (const auto& t : e["choices"][0]["token_ids"]) ids.push_back(t.get<int64_t>());
  }
  CHECK(json(ids) == c2["output_ids"]);
}

TEST_CASE_METHOD(TwoEngines, "a request caught by the SIGKILL of a frozen engine is answered by the standby",
                             "[front][engine]") {
  if (!ok) return;
  StartFront({"--active", a.addr(), "--standby", b.addr()});

  // Frozen, the engine cannot answer: the request is surely in flight, with
  // no response byte, when the kill comes.
  a.child.Kill(SIGSTOP);
  const json& c = golden["cases"][1];
  json req = PlainRequest(c);
  HttpResult r;
  std::thread client([&] { r = Complete(req); });
  REQUIRE(WaitFor(
      [&] {
        auto st = ctl.Call({{"type", "status"}});
        return st && (*st)["inflight"][a.addr()] == 1;
      },
      10s));
  a.child.Kill(SIGKILL);
  client.join();
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["choices"][0]["text"] == c["output_text_latin1"]);
  json st = wsup::test::ReplyOr(ctl.Call({{"type", "status"}}));
  CHECK(st["counters"]["retried"] == 1);
  CHECK(st["active"] == b.addr());
}

namespace {

// A streamed completion's text and whether it ended with [DONE].
std::pair<std::string, bool> StreamText(const std::string& body) {
  std::string text;
  bool done = false;
  for (const auto& d : wsup::test::SseData(body)) {
    if (d == "[DONE]") {
      done = true;
      continue;
    }
    json e = json::parse(d);
    if (e["choices"].empty()) continue;
    text += e["choices"][0]["text"].get<std::string>();
  }
  return {text, done};
}

}  // namespace

TEST_CASE_METHOD(TwoEngines,
                 "hedging: requests to a SIGSTOPped active engine are answered by the standby, whole and correct",
                 "[front][engine][hedge]") {
  if (!ok) return;
  StartFront({"--active", a.addr(), "--standby", b.addr(), "--hedge-after-ms", "200"});

  a.child.Kill(SIGSTOP);
  // One plain and one streamed request at once: both are silent on the
  // stopped engine, which the front also reports (two of two silent).
  const json& c0 = golden["cases"][0];
  const json& c1 = golden["cases"][1];
  json plain = PlainRequest(c1);
  json stream = StreamRequest(c0);
  HttpResult rp, rs;
  std::thread t1([&] { rp = Complete(plain); });
  std::thread t2([&] { rs = Complete(stream); });
  t1.join();
  t2.join();
  INFO(front->Log());
  REQUIRE(rp.status == 200);
  CHECK(json::parse(rp.body)["choices"][0]["text"] == c1["output_text_latin1"]);
  REQUIRE(rs.status == 200);
  auto [text, done] = StreamText(rs.body);
  CHECK(done);
  CHECK(text == c0["output_text_latin1"].get<std::string>());

  json st = FrontStatus(ctl);
  CHECK(st["counters"]["hedged"] == 2);
  CHECK(st["counters"]["hedge_won"] == 2);
  CHECK(st["counters"]["retried"] == 0);
  CHECK(st["counters"]["failed"] == 0);
  // The front closed its requests on the stopped engine; it stays routed
  // (the supervisor decides), so new requests try it first.
  CHECK(st["backends"][a.addr()]["inflight"] == 0);
  CHECK(st["active"] == a.addr());
  auto silent = ctl.WaitEvent("silent", "backend", a.addr(), 5s);
  REQUIRE(silent.ok());
  CHECK((*silent)["silent"] == 2);
  CHECK((*silent)["inflight"] == 2);
  CHECK((*silent)["after_ms"] == 200);
  CHECK(st["counters"]["silent_reports"] == 1);
  a.child.Kill(SIGCONT);
}

TEST_CASE_METHOD(TwoEngines,
                 "hedging: a stream that stalls after 5 tokens is resumed on the standby without gap or repeat",
                 "[front][engine][hedge]") {
  if (!ok) return;
  // The relay passes five events of the active engine, then holds the rest:
  // a stream that goes silent mid-way while the engine still runs.
  HoldingRelay relay(a.port, 5);
  StartFront({"--active", relay.addr(), "--standby", b.addr(), "--hedge-after-ms", "200"});

  const json& c = golden["cases"][0];
  json req = StreamRequest(c);
  HttpResult r = Complete(req);
  INFO(front->Log());
  REQUIRE(r.status == 200);
  CHECK(relay.events_passed() == 5);
  auto [text, done] = StreamText(r.body);
  CHECK(done);
  CHECK(text == c["output_text_latin1"].get<std::string>());
  json st = FrontStatus(ctl);
  CHECK(st["counters"]["hedged"] == 1);
  CHECK(st["counters"]["hedge_won"] == 1);
  CHECK(st["counters"]["resumed"] == 0);  // a hedge, not a resume after a failure
  CHECK(st["backends"][relay.addr()]["inflight"] == 0);
  // One silent request alone is not reported: it may be one slow request.
  CHECK(st["counters"]["silent_reports"] == 0);
}

TEST_CASE_METHOD(TwoEngines,
                 "hedging: a request is hedged once in its life - a stream the hedge took over is not hedged again",
                 "[front][engine][hedge]") {
  if (!ok) return;
  Engine c = StartCpuEngine(dir, "c");
  // The active passes five events, the standby three (of the resumed
  // stream): the stream stalls on each in turn.
  HoldingRelay ra(a.port, 5), rb(b.port, 3);
  StartFront({"--active", ra.addr(), "--standby", rb.addr(), "--hedge-after-ms", "200"});

  const json& cs = golden["cases"][0];
  json req = StreamRequest(cs);
  HttpResult r;
  std::thread client([&] { r = Complete(req); });
  // Hedged on the standby, which took the stream over.
  REQUIRE(WaitFor([&] { return FrontStatus(ctl)["counters"]["hedge_won"] == 1 && rb.events_passed() == 3; }, 20s));
  // The supervisor moves the roles: the engine the stream is on is now the
  // active one, and a third is the standby. The stream stays silent on it,
  // yet it is not hedged a second time.
  REQUIRE(ctl.Call(wsup::test::SetRoutes(rb.addr(), c.addr(), 1)).ok());
  CHECK_FALSE(WaitFor([&] { return FrontStatus(ctl)["counters"]["hedged"] != 1; }, 1500ms));
  // Its engine fails: the stream is resumed on the standby (after a failure,
  // not a hedge), with no gap and no repeat.
  rb.Cut();
  client.join();
  INFO(front->Log());
  REQUIRE(r.status == 200);
  auto [text, done] = StreamText(r.body);
  CHECK(done);
  CHECK(text == cs["output_text_latin1"].get<std::string>());
  json st = FrontStatus(ctl);
  CHECK(st["counters"]["hedged"] == 1);
  CHECK(st["counters"]["resumed"] == 1);
}

TEST_CASE_METHOD(TwoEngines, "hedging: an active engine that answers first wins and the hedge is closed",
                             "[front][engine][hedge]") {
  if (!ok) return;
  // The standby is reached through a relay that passes nothing: it never answers.
  HoldingRelay mute(b.port, 0);
  StartFront({"--active", a.addr(), "--standby", mute.addr(), "--hedge-after-ms", "100"});

  a.child.Kill(SIGSTOP);
  const json& c = golden["cases"][1];
  json req = PlainRequest(c);
  HttpResult r;
  std::thread client([&] { r = Complete(req); });
  // Hedged to the mute standby; then the active engine wakes and answers.
  REQUIRE(WaitFor([&] { return FrontStatus(ctl)["counters"]["hedged"] == 1; }, 10s));
  a.child.Kill(SIGCONT);
  client.join();
  INFO(front->Log());
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["choices"][0]["text"] == c["output_text_latin1"]);
  json st = FrontStatus(ctl);
  CHECK(st["counters"]["hedge_lost"] == 1);
  CHECK(st["counters"]["hedge_won"] == 0);
  CHECK(st["backends"][mute.addr()]["inflight"] == 0);
  CHECK(st["backends"][a.addr()]["inflight"] == 0);
}

TEST_CASE_METHOD(TwoEngines, "hedging: the budget bounds hedges, and nothing is hedged without a standby",
                             "[front][engine][hedge]") {
  if (!ok) return;
  // One hedge saved up and none earned: of two silent requests one is hedged.
  StartFront({"--active", a.addr(), "--standby", b.addr(), "--hedge-after-ms", "100",
             "--hedge-percent", "0", "--hedge-burst", "1"});
  a.child.Kill(SIGSTOP);
  const json& c = golden["cases"][1];
  json req = PlainRequest(c);
  HttpResult r1, r2;
  std::thread t1([&] { r1 = Complete(req); });
  std::thread t2([&] { r2 = Complete(req); });
  REQUIRE(WaitFor(
      [&] {
        json st = FrontStatus(ctl);
        return st["counters"]["hedge_won"] == 1 && st["counters"]["hedge_refused"] == 1;
      },
      20s));
  // The other one waits on the stopped engine until it is killed, then is sent again.
  a.child.Kill(SIGKILL);
  t1.join();
  t2.join();
  INFO(front->Log());
  CHECK(r1.status == 200);
  CHECK(r2.status == 200);
  json st = FrontStatus(ctl);
  CHECK(st["counters"]["hedged"] == 1);
  CHECK(st["counters"]["hedge_refused"] == 1);
  CHECK(st["counters"]["retried"] == 1);
  // The kill made the front switch by itself; the standby had answered a
  // client (the hedge) before that: first_ok says so, and when.
  auto sw = ctl.WaitEvent("switched", "to", b.addr());
  REQUIRE(sw.ok());
  auto first = ctl.WaitEvent("first_ok", "backend", b.addr());
  REQUIRE(first.ok());
  CHECK((*first).value("hedged", false));
  CHECK((*first)["at_ms"].get<int64_t>() <= (*sw)["at_ms"].get<int64_t>());

  // Routed alone (no standby), the surviving engine's requests are never
  // hedged: two silent ones are reported (so the front judged them silent)
  // and none is hedged.
  REQUIRE(wsup::test::ReplyOr(ctl.Call(wsup::test::SetRoutes(b.addr(), "", 5)))["ok"] == true);
  b.child.Kill(SIGSTOP);
  HttpResult r3, r4;
  std::thread t3([&] { r3 = Complete(req); });
  std::thread t4([&] { r4 = Complete(req); });
  REQUIRE(ctl.WaitEvent("silent", "backend", b.addr(), 10s).ok());
  CHECK(FrontStatus(ctl)["counters"]["hedged"] == 1);
  b.child.Kill(SIGCONT);
  t3.join();
  t4.join();
  CHECK(r3.status == 200);
  CHECK(r4.status == 200);
  CHECK(FrontStatus(ctl)["counters"]["hedged"] == 1);
}
