// Chaos: the scenarios an adversarial operator found against a real node,
// each replayed on the real processes (supervisor, holder, engines, front on
// the tiny checkpoint, CPU) and each asserting the fixed behaviour:
//   1. a deeply nested body gets a 400 and the front keeps running;
//   2. abandoned non-streamed requests cause no failover and no retry;
//   3. a node whose engine ports collide with another node's is refused
//      before its engines start, and the other node is never adopted;
//   4. a failed start leaves no process behind; the next start is ready;
//   5. 1,000 idle holder connections never stop an engine from attaching;
//   6. a frozen standby is not promoted;
//   7. a restarted supervisor adopts engines whose first answers are slow;
//   8. a failover while no supervisor runs gets a reconstructed row;
//   9. the active dies while the engine it replaced still drains: the
//      draining one takes the traffic back at once;
//   and a crash-looping front is throttled and reported, never left down.
// Each test bounds every wait; the node fixture ends every process it
// started, whatever happens.
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "testkit/http_client.h"
#include "tests/node/node_fixture.h"
#include "tests/probes/scripted_server.h"
#include "testkit/test_util.h"
#include "wire/json_call.h"
#include "wire/protocol.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using namespace nodetest;
using nlohmann::json;

// A socket listening on a loopback port, held by the test.
struct HeldPort {
  int fd = -1;
  int port = 0;
  HeldPort() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd, 8);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  void Release() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ~HeldPort() { Release(); }
};

std::optional<json> FrontStatus(const Node& n) {
  auto r = JsonCall(n.FrontSocket(), json{{"type", "status"}}, 2000);
  if (!r.ok()) return std::nullopt;
  return *r;
}

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

pid_t EnginePid(const Node& n, const std::string& role) {
  auto s = n.Status();
  return s ? static_cast<pid_t>(test::EngineOf(*s, role).value("pid", 0)) : 0;
}

char RunState(pid_t pid) {
  std::string stat = test::ReadAll("/proc/" + std::to_string(pid) + "/stat");
  auto rp = stat.rfind(')');
  return rp == std::string::npos || rp + 2 >= stat.size() ? '?' : stat[rp + 2];
}

// ---------------------------------------------------------------- 1

TEST_CASE("chaos 1: a body nesting 70,000 levels deep gets a 400 and the front keeps its pid", "[chaos]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  int port = n.FrontPort();
  pid_t front = (*n.Status())["front"].value("pid", 0);
  REQUIRE(front > 0);
  const int d = 70000;
  std::string deep = "{\"stream\":true,\"prompt\":" + std::string(d, '[') + std::string(d, ']') + "}";
  for (const std::string& body :
       {deep, "{\"prompt\":" + std::string(d, '[') + std::string(d, ']') + "}",
        "{\"stream\":true,\"prompt\":" + std::string(d, '{') + std::string(d, '}') + "}"}) {
    auto r = test::HttpRequestOnce(port, "POST", "/v1/completions", body, 20s, {{"Content-Type", "application/json"}});
    INFO(r.error << " " << r.body.substr(0, 300));
    CHECK(r.status == 400);
    CHECK(r.body.find("nest") != std::string::npos);
  }
  CHECK((*n.Status())["front"].value("pid", 0) == front);
  CHECK((*n.Status())["front"].value("restarts", -1) == 0);
  CHECK(Complete(port) == kGolden);
}

// ---------------------------------------------------------------- 2

TEST_CASE("chaos 2: 20 abandoned non-streamed requests cause no failover and no retry on the standby", "[chaos]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  int port = n.FrontPort();
  pid_t active = EnginePid(n, "active");
  {
    std::vector<test::HttpConn> conns(20);
    json req{{"prompt", "Hello, world"}, {"max_tokens", 490}, {"temperature", 0}};
    for (auto& c : conns) {
      REQUIRE(c.Connect(port));
      REQUIRE(c.Send(test::FormatRequest("POST", "/v1/completions", req.dump(),
                                         {{"Content-Type", "application/json"}})));
    }
    // Every client gives up at once.
  }
  // The front sees each client go and stops its request. The bound is wide
  // for a loaded two-core machine; what the front counted is shown on failure.
  json seen;
  bool all_closed = test::WaitFor(
      [&] {
        auto f = FrontStatus(n);
        if (f) seen = *f;
        return f && (*f)["counters"].value("client_closed", 0) >= 20;
      },
      30s);
  auto node = n.Status();
  INFO("front counters: " << seen.value("counters", json()).dump() << "; accepted " << seen.value("accepted", -1)
                          << "; front restarts " << (node ? (*node)["front"].value("restarts", -1) : -1));
  if (!all_closed) INFO(n.LogTails(200));
  REQUIRE(all_closed);
  // The engine drops the abandoned work.
  auto engine_idle = [&] {
    auto j = n.EngineStatus("active");
    return j && (*j)["requests"].value("active", -1) == 0 && (*j)["requests"].value("waiting", -1) == 0;
  };
  REQUIRE(test::WaitFor(engine_idle, 10s));
  // Probes keep passing on the active: several more of them, and no trip.
  auto probes = [&] {
    auto m = n.Metrics();
    auto s = n.Status();
    std::string slot = s ? test::EngineOf(*s, "active").value("slot", "a") : "a";
    return test::MetricValue(m, "wsup_probe_latency_seconds_count{slot=\"" + slot + "\"}");
  };
  double before = probes();
  REQUIRE(test::WaitFor([&] { return probes() >= before + 5; }, 20s));
  // The supervisor's probes reached the engine as probes (with its token),
  // admitted ahead of its queue.
  auto es = n.EngineStatus("active");
  REQUIRE(es);
  CHECK((*es)["requests"].value("probes", 0) >= 5);
  CHECK(Query(n.Db(), "select * from failovers").rows.empty());
  CHECK(EnginePid(n, "active") == active);
  auto f = FrontStatus(n);
  REQUIRE(f);
  CHECK((*f)["counters"].value("retried", -1) == 0);
  CHECK((*f)["counters"].value("switched_self", -1) == 0);
  CHECK(Complete(port) == kGolden);
}

// ---------------------------------------------------------------- 3

TEST_CASE("chaos 3: a node whose engine ports collide is refused before its engines start - the other is untouched",
          "[chaos]") {
  if (!Have()) return;
  int p1 = test::UnusedPort(), p2 = test::UnusedPort();
  REQUIRE(p1 != p2);
  Node a({"engine.primary_port=" + std::to_string(p1), "engine.standby_port=" + std::to_string(p2)});
  a.Start();
  REQUIRE(a.WaitServing());
  auto before = *a.Status();
  Node b({"engine.primary_port=" + std::to_string(p1), "engine.standby_port=" + std::to_string(p2),
          "node.name=\"other\""});
  b.Start();
  REQUIRE(b.sup().Wait(30s) >= 0);
  CHECK(b.sup().exit_code() == 78);
  std::string log = b.Log();
  INFO(log);
  CHECK(log.find("engine.primary_port") != std::string::npos);
  CHECK(log.find("in use") != std::string::npos);
  CHECK(log.find("engine reports ready") == std::string::npos);
  // B started nothing and left nothing.
  CHECK(b.Processes().empty());
  CHECK(test::ReadAll(b.dir().Join("run/state.json")).empty());
  // A is untouched: same engines, no failover, still serving.
  auto after = *a.Status();
  for (const char* role : {"active", "standby"}) CHECK(test::EngineOf(after, role)["pid"] == test::EngineOf(before, role)["pid"]);
  CHECK(Query(a.Db(), "select * from failovers").rows.empty());
  CHECK(Complete(a.FrontPort()) == kGolden);
}

TEST_CASE("chaos 3: an answer on the engine's port from a process with another nonce is never taken for ready",
          "[chaos]") {
  if (!Have()) return;
  // An "engine" that serves a wsup-like status with someone else's nonce,
  // as another node's engine on a colliding port would.
  std::string script =
      "import http.server,json,sys\n"
      "class H(http.server.BaseHTTPRequestHandler):\n"
      "  def do_GET(self):\n"
      "    b=json.dumps({'state':'ready','nonce':'someone-else'}).encode()\n"
      "    self.send_response(200); self.send_header('Content-Type','application/json')\n"
      "    self.send_header('Content-Length',str(len(b))); self.end_headers(); self.wfile.write(b)\n"
      "  def log_message(self,*a): pass\n"
      "http.server.HTTPServer(('127.0.0.1',int(sys.argv[1])),H).serve_forever()\n";
  test::TempDir d;
  std::string py = d.Join("impostor.py");
  {
    std::ofstream f(py);
    f << script;
  }
  Node n({"engine.command=[\"python3\", \"" + py + "\", \"{port}\"]", "weight_cache.mode=\"off\"", "kv.pool_mib=0"});
  n.Start();
  REQUIRE(test::WaitFor([&] { return n.Log().find("is answered by another process") != std::string::npos; }, 30s));
  auto s = n.Status();
  REQUIRE(s);
  INFO(s->dump());
  CHECK((*s)["active"].is_null());
  for (const auto& e : (*s)["engines"]) CHECK(e.value("state", "") == "starting");
  CHECK(n.Log().find("engine reports ready") == std::string::npos);
}

// ---------------------------------------------------------------- 4

TEST_CASE("chaos 4: a start that fails leaves no process behind, and the next start is ready", "[chaos]") {
  if (!Have()) return;
  SECTION("the front's port is taken") {
    HeldPort held;
    Node n({"front.listen=127.0.0.1:" + std::to_string(held.port)});
    n.Start();
    REQUIRE(n.sup().Wait(30s) >= 0);
    CHECK(n.sup().exit_code() == 78);
    INFO(n.Log());
    CHECK(n.Log().find("front.listen") != std::string::npos);
    CHECK(n.Processes().empty());
    // The port is freed: the same node starts and serves.
    held.Release();
    n.Start();
    REQUIRE(n.WaitServing());
    CHECK(Complete(n.FrontPort()) == kGolden);
  }
  SECTION("the holder program cannot be started, after the front was") {
    // It exists and is executable (the preflight passes), but exec fails:
    // its interpreter is missing. The front is running by then.
    test::TempDir bin;
    std::string holder = bin.Join("wsup-holder");
    {
      std::ofstream f(holder);
      f << "#!/nonexistent/interpreter\n";
    }
    ::chmod(holder.c_str(), 0755);
    Node n({"holder.command=[\"" + holder + "\", \"--socket\", \"{socket}\"]"});
    n.Start();
    REQUIRE(n.sup().Wait(30s) >= 0);
    CHECK(n.sup().exit_code() == 78);
    INFO(n.Log());
    CHECK(n.Log().find("started front") != std::string::npos);
    CHECK(n.Log().find(holder) != std::string::npos);
    CHECK(test::WaitFor([&] { return n.Processes().empty(); }, 10s));
    CHECK(test::ReadAll(n.dir().Join("run/state.json")).empty());
  }
  SECTION("the engine program does not exist: refused before anything starts") {
    Node n({"engine.command=[\"/nonexistent/engine\", \"--port\", \"{port}\"]"});
    n.Start();
    REQUIRE(n.sup().Wait(30s) >= 0);
    CHECK(n.sup().exit_code() == 78);
    INFO(n.Log());
    CHECK(n.Log().find("engine.command: the engine program /nonexistent/engine does not exist") != std::string::npos);
    CHECK(n.Log().find("started front") == std::string::npos);
    CHECK(n.Processes().empty());
  }
  SECTION("`wsup stop` finds what a killed supervisor left, through the runtime dir") {
    Node n;
    n.Start();
    REQUIRE(n.WaitServing());
    n.sup().Kill(SIGKILL);
    REQUIRE(n.sup().Wait(5s) >= 0);
    REQUIRE(!n.Processes().empty());
    auto r = n.Cli({"stop"});
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("no supervisor was running") != std::string::npos);
    CHECK(r.output.find("engine a") != std::string::npos);
    CHECK(r.output.find("holder rank 0") != std::string::npos);
    CHECK(test::WaitFor([&] { return n.Processes().empty(); }, 10s));
    // Nothing is left to stop the second time: a clear error.
    auto again = n.Cli({"stop"});
    CHECK(again.exit_code != 0);
  }
}

// ---------------------------------------------------------------- 5

TEST_CASE("chaos 5: 1,000 idle holder connections never stop an engine from attaching", "[chaos]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  std::string sock = n.dir().Join("run/holder.sock");
  std::vector<int> fds;
  auto frame = EncodeFrame(json{{"type", "info"}});
  REQUIRE(frame.ok());
  for (int i = 0; i < 1000; ++i) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", sock.c_str());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      continue;
    }
    if (::write(fd, frame->data(), frame->size()) != static_cast<ssize_t>(frame->size())) {
      ::close(fd);
      continue;
    }
    fds.push_back(fd);
  }
  INFO(fds.size() << " connections open");
  CHECK(fds.size() >= 900);
  // A re-armed engine attaches: kill the standby, wait for its cache hit.
  auto count = [&](const char* result) {
    return Query(n.Db(), std::string("select * from cache_events where result='") + result + "'").rows.size();
  };
  size_t hits = count("hit"), misses = count("miss");
  pid_t standby = EnginePid(n, "standby");
  REQUIRE(standby > 0);
  REQUIRE(::kill(standby, SIGKILL) == 0);
  // The re-armed engine comes up (bounded generously: under sanitizers on a
  // loaded machine a restart takes seconds) and it attached: a hit, no miss.
  CHECK(n.WaitServing(kSanitizedNode ? 120s : 30s));
  CHECK(test::WaitFor([&] { return count("hit") > hits; }, 30s));
  INFO(Query(n.Db(), "select slot, result, mode, miss_reason from cache_events").Dump());
  CHECK(count("miss") == misses);
  // The operator's view of the holder works too.
  auto info = test::Run({test::BinPath("wsup"), "cache", "info", "--socket", sock}, 30s);
  INFO(info.output);
  CHECK(info.exit_code == 0);
  for (int fd : fds) ::close(fd);
}

// ---------------------------------------------------------------- 6

TEST_CASE("chaos 6: a frozen standby is not promoted - the clients are served once an engine is proven", "[chaos]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  auto s = *n.Status();
  pid_t active = test::EngineOf(s, "active").value("pid", 0);
  pid_t standby = test::EngineOf(s, "standby").value("pid", 0);
  std::string standby_slot = test::EngineOf(s, "standby").value("slot", "");
  REQUIRE(::kill(standby, SIGSTOP) == 0);
  REQUIRE(test::WaitFor([&] { return RunState(standby) == 'T'; }, 5s));
  REQUIRE(::kill(active, SIGKILL) == 0);
  REQUIRE(test::WaitFor([&] { return !Query(n.Db(), "select * from failovers").rows.empty(); }, 10s));
  auto f = Query(n.Db(), "select * from failovers").rows[0];
  INFO(f["reason"]);
  CHECK(f["to_slot"] == "none");
  CHECK(f["reason"].find("not promoted") != std::string::npos);
  CHECK(f["reason"].find("stopped") != std::string::npos);
  // The frozen engine was replaced, not kept.
  CHECK(test::WaitFor([&] { return RunState(standby) == '?'; }, 10s));
  // Clients wait in the front and are served by the first engine proven.
  CHECK(Complete(n.FrontPort()) == kGolden);
  REQUIRE(n.WaitServing());
  json now = *n.Status();
  for (const auto& e : now["engines"]) CHECK(e.value("pid", 0) != standby);
  ::kill(standby, SIGCONT);
}

// ---------------------------------------------------------------- 7

TEST_CASE("chaos 7: a restarted supervisor adopts both engines even when their first answers are slow", "[chaos]") {
  if (!Have()) return;
  Node n({"probe.failures=5"});
  n.Start();
  REQUIRE(n.WaitServing());
  auto before = *n.Status();
  std::set<int> pids;
  for (const auto& e : before["engines"]) pids.insert(e.value("pid", 0));
  n.sup().Kill(SIGKILL);
  REQUIRE(n.sup().Wait(5s) >= 0);
  // Both engines stop answering while the new supervisor adopts them.
  for (int p : pids) REQUIRE(::kill(p, SIGSTOP) == 0);
  for (int p : pids) REQUIRE(test::WaitFor([&] { return RunState(p) == 'T'; }, 5s));
  n.Start();
  // It adopts them by what they are, not by how fast they answer ...
  bool adopted = n.WaitStatus(
      [&](const json& st) {
        std::set<int> now;
        for (const auto& e : st["engines"]) now.insert(e.value("pid", 0));
        return now == pids;
      },
      20s);
  if (!adopted) FAIL_CHECK(n.Log());
  REQUIRE(adopted);
  // ... and its first probes of them fail (the delay is real) ...
  REQUIRE(test::WaitFor([&] { return n.Log().find("probe") != std::string::npos &&
                                     test::MetricValue(n.Metrics(), "wsup_probe_failures_total{slot=\"a\"}") +
                                             test::MetricValue(n.Metrics(), "wsup_probe_failures_total{slot=\"b\"}") >= 1; },
                        20s));
  for (int p : pids) ::kill(p, SIGCONT);
  // ... which the probes' own thresholds absorb: same engines, serving.
  REQUIRE(n.WaitServing());
  std::set<int> after;
  json now = *n.Status();
  for (const auto& e : now["engines"]) after.insert(e.value("pid", 0));
  CHECK(after == pids);
  CHECK(Query(n.Db(), "select * from failovers").rows.empty());
  CHECK(Complete(n.FrontPort()) == kGolden);
}

// ---------------------------------------------------------------- 8

TEST_CASE("chaos 8: a failover while no supervisor runs gets a reconstructed row dated from the front", "[chaos]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  auto s = *n.Status();
  json active = test::EngineOf(s, "active");
  json standby = test::EngineOf(s, "standby");
  std::string standby_addr = "127.0.0.1:" + std::to_string(standby.value("port", 0));
  n.sup().Kill(SIGKILL);
  REQUIRE(n.sup().Wait(5s) >= 0);
  int64_t killed_ms = WallMs();
  REQUIRE(::kill(active.value("pid", 0), SIGKILL) == 0);
  // Traffic moves on by itself: the front switches to the standby.
  int port = n.FrontPort() ? n.FrontPort() : std::atoi(s["front"].value("listen", "").c_str() +
                                                       s["front"].value("listen", "").rfind(':') + 1);
  CHECK(Complete(port) == kGolden);
  REQUIRE(test::WaitFor(
      [&] {
        auto f = FrontStatus(n);
        return f && f->value("active", json()).is_string() && (*f)["active"] == standby_addr;
      },
      10s));
  int64_t restarted_ms = WallMs();
  n.Start();
  REQUIRE(n.WaitServing());
  REQUIRE(test::WaitFor(
      [&] { return !Query(n.Db(), "select * from failovers where reconstructed = 1").rows.empty(); }, 10s));
  auto f = Query(n.Db(), "select * from failovers where reconstructed = 1").rows[0];
  INFO(f["reason"]);
  CHECK(f["from_slot"] == active.value("slot", ""));
  CHECK(f["to_slot"] == standby.value("slot", ""));
  CHECK(f["trigger"] == "crash");
  int64_t fault = std::stoll(f["fault_ms"]);
  // When the front switched: after the kill, before the new supervisor.
  CHECK(fault >= killed_ms - 5);
  CHECK(fault <= restarted_ms);
  // The dead slot's recovery is dated from the same fault, not from the
  // moment the new supervisor noticed.
  REQUIRE(test::WaitFor(
      [&] { return !Query(n.Db(), "select * from recoveries where failover_id = " + f["id"]).rows.empty(); }, 20s));
  auto rec = Query(n.Db(), "select * from recoveries where failover_id = " + f["id"]).rows[0];
  CHECK(rec["cause"] == "crash");
  CHECK(std::stoll(rec["fault_ms"]) == fault);
}

// ---------------------------------------------------------------- front crash loop

// ---------------------------------------------------------------- 9

// A node whose engines step at least every 20 ms: a 150-token stream keeps
// its engine busy for 3 s or more, and the probes' budget allows the pace.
std::vector<std::string> PacedEngines() {
  const std::string eng = test::BinPath("wsup-engine");
  return {"engine.command=[\"" + eng +
              "\", \"--model\", \"{model}\", \"--port\", \"{port}\", \"--weight-cache\", \"{mode}\", "
              "\"--socket\", \"{socket}\", \"--device\", \"{devices}\", \"--revision\", \"{revision}\", "
              "\"--kv-cache-mib\", \"8\", \"--min-step-ms\", \"20\"]",
          "probe.timeout_ms=1500", "probe.interval_ms=1500"};
}

// The token ids of a streamed completion's body, and its finish reason.
std::vector<int64_t> StreamIds(const std::string& body, std::string* finish) {
  std::vector<int64_t> ids;
  for (const auto& d : test::SseData(body)) {
    if (d == "[DONE]") continue;
    auto j = json::parse(d, nullptr, false);
    if (j.is_discarded() || !j.contains("choices")) continue;
    for (const auto& c : j["choices"]) {
      if (c.contains("token_ids")) {
        for (const auto& t : c["token_ids"]) ids.push_back(t.get<int64_t>());
      }
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) *finish = c["finish_reason"];
    }
  }
  return ids;
}

TEST_CASE("chaos 9: the active dies while the engine it replaced drains - that one takes the traffic back at once",
          "[chaos]") {
  if (!Have()) return;
  // Paced engines: the stream keeps its engine draining after a planned drill.
  Node n(PacedEngines());
  n.Start();
  if (!n.WaitServing()) FAIL(n.Log());
  auto s0 = *n.Status();
  const json first = test::EngineOf(s0, "active");
  const std::string old_slot = first.value("slot", "");
  const pid_t old_pid = first.value("pid", 0);
  const std::string old_addr = "127.0.0.1:" + std::to_string(first.value("port", 0));
  const int port = n.FrontPort();

  // A long stream on the active engine.
  test::HttpResult stream;
  std::atomic<bool> stream_ended{false};
  std::thread streamer([&] {
    json req{{"prompt", "Hello, world"}, {"max_tokens", 150}, {"temperature", 0}, {"stream", true},
             {"return_token_ids", true}};
    stream = test::HttpRequestOnce(port, "POST", "/v1/completions", req.dump(), 60s,
                                   {{"Content-Type", "application/json"}});
    stream_ended = true;
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{streamer};
  REQUIRE(test::WaitFor(
      [&] {
        auto f = FrontStatus(n);
        return f && (*f)["inflight"].value(old_addr, int64_t{0}) > 0;
      },
      10s));

  // A planned drill: the standby takes new traffic, the old active drains
  // the stream.
  auto drill = n.Cli({"failover", "--drill", "--json"});
  INFO(drill.output);
  REQUIRE(drill.exit_code == 0);
  auto s1 = *n.Status();
  INFO(s1.dump());
  const json fresh = test::EngineOf(s1, "active");
  REQUIRE(fresh.value("slot", "") != old_slot);
  bool draining = false;
  for (const auto& e : s1["engines"]) draining |= e.value("slot", "") == old_slot && e.value("state", "") == "draining";
  REQUIRE(draining);

  // The new active dies while the old one drains.
  const int64_t killed_ms = WallMs();
  REQUIRE(::kill(fresh.value("pid", 0), SIGKILL) == 0);
  // Taken back at once: before the stream (and so the drain) ended.
  REQUIRE(n.WaitStatus([&](const json& st) { return st.value("active", json()) == json(old_slot); }, 10s));
  const int64_t back_ms = WallMs() - killed_ms;
  CHECK_FALSE(stream_ended);
  auto s2 = *n.Status();
  INFO(s2.dump());
  CHECK(test::EngineOf(s2, "active").value("pid", 0) == old_pid);
  CHECK(Complete(port) == kGolden);
  // The stream it was draining was never cut: every token, once.
  streamer.join();
  CHECK(stream.status == 200);
  std::string finish;
  const int tokens = static_cast<int>(StreamIds(stream.body, &finish).size());
  CHECK(tokens == 150);
  CHECK(finish == "length");
  // The ledger: the drill, then the crash handed to the draining engine.
  REQUIRE(test::WaitFor([&] { return Query(n.Db(), "select * from failovers").rows.size() >= 2; }, 10s));
  auto rows = Query(n.Db(), "select * from failovers order by id").rows;
  INFO(Rows{rows}.Dump());
  CHECK(rows[1]["trigger"] == "crash");
  CHECK(rows[1]["to_slot"] == old_slot);
  CHECK(rows[1]["reason"].find("took the traffic back") != std::string::npos);
  // The killed slot comes back as the standby, and the failover has ended
  // (a correct answer came through the front).
  CHECK(n.WaitServing());
  CHECK(n.WaitStatus([](const json& st) { return !st["failover"].value("in_progress", true); }, 20s));
  // How long the crash left the node without an engine, for the log.
  WARN("the draining engine was active again " << back_ms << " ms after the kill");
}

TEST_CASE("chaos 10: a SIGKILLed active is seen through its death word, and its stream is cut over at once",
          "[chaos]") {
  if (!Have()) return;
  Node n(PacedEngines());
  n.Start();
  if (!n.WaitServing()) FAIL(n.Log());
  auto s0 = *n.Status();
  INFO(s0.dump());
  for (const auto& e : s0["engines"]) CHECK(e.value("death_seen_by", "") == "death_word");
  const json first = test::EngineOf(s0, "active");
  const std::string old_addr = "127.0.0.1:" + std::to_string(first.value("port", 0));
  const int port = n.FrontPort();
  auto text = n.Cli({"status"});
  CHECK(text.output.find("death seen by death_word") != std::string::npos);

  json req{{"prompt", "Hello, world"}, {"max_tokens", 100}, {"temperature", 0}, {"stream", true},
           {"return_token_ids", true}};
  test::HttpResult stream;
  std::thread streamer([&] {
    stream = test::HttpRequestOnce(port, "POST", "/v1/completions", req.dump(), 60s,
                                   {{"Content-Type", "application/json"}});
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{streamer};
  // Killed once tokens flow (its bytes keep coming for 100 ms), so that the
  // stream is resumed from what the client has, not sent again.
  const int64_t asked_ms = WallMs();
  int64_t first_byte_ms = 0;
  REQUIRE(test::WaitFor(
      [&] {
        auto f = FrontStatus(n);
        if (!f || (*f)["inflight"].value(old_addr, int64_t{0}) == 0) return false;
        const int64_t last = (*f)["backends"][old_addr].value("last_byte_ms", int64_t{0});
        if (last < asked_ms) return false;
        if (first_byte_ms == 0) first_byte_ms = last;
        return last >= first_byte_ms + 100;
      },
      10s));
  REQUIRE(::kill(first.value("pid", 0), SIGKILL) == 0);
  streamer.join();
  REQUIRE(stream.status == 200);
  std::string finish;
  const auto cut_ids = StreamIds(stream.body, &finish);
  CHECK(cut_ids.size() == 100);
  CHECK(finish == "length");
  // The ledger says how the death was seen; the front says the stream was
  // resumed (not failed) and that the supervisor cut it over.
  REQUIRE(test::WaitFor([&] { return !Query(n.Db(), "select * from failovers").rows.empty(); }, 10s));
  auto rows = Query(n.Db(), "select * from failovers order by id").rows;
  INFO(Rows{rows}.Dump());
  CHECK(rows[0]["trigger"] == "crash");
  CHECK(rows[0]["reason"].find("its death word was marked") != std::string::npos);
  auto f = FrontStatus(n);
  REQUIRE(f.has_value());
  INFO(f->dump());
  CHECK((*f)["counters"]["failed"] == 0);
  CHECK((*f)["counters"]["resumed"] == 1);
  CHECK(n.Log().find("cut from the dead engine") != std::string::npos);
  // The same request uninterrupted gives the same tokens.
  auto again = test::HttpRequestOnce(port, "POST", "/v1/completions", req.dump(), 60s,
                                     {{"Content-Type", "application/json"}});
  REQUIRE(again.status == 200);
  std::string finish2;
  CHECK(StreamIds(again.body, &finish2) == cut_ids);
  CHECK(n.WaitServing());
}

TEST_CASE("chaos: a crash-looping front is throttled and reported, and comes back", "[chaos]") {
  if (!Have()) return;
  Node n({"supervisor.max_restarts=3", "supervisor.restart_backoff_ms=100", "supervisor.restart_backoff_max_ms=400"});
  n.Start();
  REQUIRE(n.WaitServing());
  for (int i = 0; i < 5; ++i) {
    pid_t f = 0;
    REQUIRE(n.WaitStatus(
        [&](const json& s) {
          f = s["front"].value("pid", 0);
          return f > 0 && s["front"].value("state", "") == "ready";
        },
        20s));
    REQUIRE(::kill(f, SIGKILL) == 0);
    REQUIRE(n.WaitStatus([&](const json& s) { return s["front"].value("pid", 0) != f; }, 20s));
  }
  auto s = *n.Status();
  INFO(s.dump());
  CHECK(s["front"].value("crash_looping", false));
  CHECK(s["front"].value("restarts", 0) >= 5);
  CHECK(test::MetricValue(n.Metrics(), "wsup_front_crash_looping") == 1);
  CHECK(n.Log().find("crash-looping") != std::string::npos);
  // Never left down: it serves again.
  REQUIRE(n.WaitStatus([](const json& st) { return st["front"].value("state", "") == "ready"; }, 20s));
  CHECK(Complete(n.FrontPort()) == kGolden);
}

}  // namespace
}  // namespace wsup
