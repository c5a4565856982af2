// End-to-end tests of what a node keeps and shows: an engine.env secret is
// never shown or stored, the state is private, and the ledger tells the
// truth about rows it could not write (a full disk, the file deleted under
// the supervisor).
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "testkit/http_client.h"
#include "tests/node/node_fixture.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using namespace nodetest;

int Mode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 0777) : -1;
}

int AdminPort(const Node& n) {
  auto s = n.Status();
  if (!s) return 0;
  std::string a = s->value("admin", "");
  return std::atoi(a.c_str() + a.rfind(':') + 1);
}

// demo.toml with `env = { HF_TOKEN = "<token>" }` in its [engine] section,
// written whole under a new name and renamed into place.
void WriteConfigWithToken(const std::string& path, const std::string& token) {
  std::string text = test::ReadAll(std::string(WSUP_SOURCE_DIR) + "/config/demo.toml");
  const size_t at = text.find("ready_timeout_ms = 60000\n");
  REQUIRE(at != std::string::npos);
  text.insert(at, "env = { HF_TOKEN = \"" + token + "\" }\n");
  std::ofstream(path + ".new") << text;
  std::filesystem::rename(path + ".new", path);
}

std::string RandomToken() {
  std::random_device rd;
  std::string t = "hf_";
  const char* abc = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  for (int i = 0; i < 34; ++i) t += abc[rd() % 62];
  return t;
}

// Every place acceptance names, as (what, text).
std::vector<std::pair<std::string, std::string>> Surfaces(const Node& n) {
  std::vector<std::pair<std::string, std::string>> out;
  const int admin = AdminPort(n);
  out.emplace_back("/status", test::HttpRequestOnce(admin, "GET", "/status", "", 5s).body);
  out.emplace_back("/metrics", test::HttpRequestOnce(admin, "GET", "/metrics", "", 5s).body);
  out.emplace_back("wsup status --json", n.Cli({"status", "--json"}).output);
  out.emplace_back("wsup status", n.Cli({"status"}).output);
  out.emplace_back("wsup report --json", n.Cli({"report", "--json"}).output);
  out.emplace_back("the supervisor's output", n.Log());
  for (const char* f : {"state/wsup.db", "state/wsup.db-wal", "state/wsup.db-lost"}) {
    out.emplace_back(f, test::ReadAll(n.dir().Join(f)));
  }
  for (const auto& e : std::filesystem::directory_iterator(n.dir().Join("state/logs"))) {
    out.emplace_back(e.path().string(), test::ReadAll(e.path().string()));
  }
  return out;
}

void CheckNowhere(const Node& n, const std::vector<std::string>& secrets) {
  for (const auto& [what, text] : Surfaces(n)) {
    INFO(what);
    CHECK((!text.empty() || what == "state/wsup.db-wal"));
    for (const auto& s : secrets) CHECK(text.find(s) == std::string::npos);
  }
}

TEST_CASE("node: an engine.env secret appears nowhere after a reload, a drill and a restart - the state is private",
          "[node]") {
  if (!Have()) return;
  const std::string first = RandomToken(), second = RandomToken();
  Node n({"supervisor.rollout_watch_ms=500"});
  const std::string config = n.dir().Join("node.toml");
  WriteConfigWithToken(config, first);
  n.UseConfig(config);
  // A state_dir left open to everyone is made private.
  REQUIRE(::mkdir(n.dir().Join("state").c_str(), 0755) == 0);
  REQUIRE(::chmod(n.dir().Join("state").c_str(), 0755) == 0);
  n.Start();
  REQUIRE(n.WaitServing());
  CHECK(n.Log().find("made it private") != std::string::npos);

  // A reload to a new token rolls both engines.
  WriteConfigWithToken(config, second);
  auto reload = n.Cli({"reload", "--json"});
  INFO(reload.output);
  REQUIRE(reload.exit_code == 0);
  INFO(n.Log());
  REQUIRE(n.WaitServing());
  auto drill = n.Cli({"failover", "--drill", "--json"});
  INFO(drill.output);
  REQUIRE(drill.exit_code == 0);
  CHECK(json::parse(drill.output).value("recorded", false));
  REQUIRE(n.WaitServing());
  CheckNowhere(n, {first, second});

  // The names, and whether a value changed, are still shown.
  auto rows = Query(n.Db(), "SELECT command_before, command_after FROM rollouts");
  INFO(rows.Dump());
  REQUIRE(rows.rows.size() == 1);
  CHECK(rows.rows[0].at("command_before").find("HF_TOKEN") != std::string::npos);
  CHECK(rows.rows[0].at("command_after").find("sha256:") != std::string::npos);
  CHECK(rows.rows[0].at("command_before") != rows.rows[0].at("command_after"));
  auto st = n.Status();
  REQUIRE(st);
  CHECK(test::EngineOf(*st, "active").value("version", "").find("HF_TOKEN") != std::string::npos);

  n.Stop();
  n.Start();
  REQUIRE(n.WaitServing());
  CheckNowhere(n, {first, second});
  CHECK(Mode(n.dir().Join("state")) == 0700);
  CHECK(Mode(n.dir().Join("state/logs")) == 0700);
  for (const char* f : {"state/wsup.db", "state/wsup.db-wal", "state/wsup.db-shm", "state/wsup.db-lost"}) {
    INFO(f);
    CHECK(Mode(n.dir().Join(f)) == 0600);
  }
}

TEST_CASE("node: a state_dir other users can read, owned by another user, is refused at start with exit 78 and "
          "the fix",
          "[node]") {
  if (!Have() || SkipWithoutRoot("to give the state_dir to another uid")) return;
  Node n;
  const std::string state = n.dir().Join("state");
  REQUIRE(::mkdir(state.c_str(), 0755) == 0);
  REQUIRE(::chmod(state.c_str(), 0755) == 0);
  REQUIRE(::chown(state.c_str(), 65534, 65534) == 0);
  auto r = test::Run(n.Argv("start"), 60s);
  INFO(r.output);
  CHECK(r.exit_code == 78);
  CHECK(r.output.find("node.state_dir " + state + ": is mode 0755 and owned by uid 65534") != std::string::npos);
  CHECK(r.output.find("chmod 0700") != std::string::npos);
  CHECK(Mode(state) == 0755);  // not ours: left as it was
}

// A small tmpfs mounted on a folder for the test's life, unmounted however
// the test ends.
class Tmpfs {
 public:
  Tmpfs(const std::string& dir, const std::string& size) : dir_(dir) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return;
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, ("size=" + size + ",mode=0700").c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~Tmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string error_;
};

// Writes `path` until the file system has no room left; the bytes written.
int64_t FillUp(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  std::string chunk(1 << 20, 'x');
  int64_t total = 0;
  for (size_t size : {size_t{1} << 20, size_t{4096}, size_t{1}}) {
    for (;;) {
      ssize_t w = ::write(fd, chunk.data(), size);
      if (w <= 0) break;
      total += w;
    }
  }
  ::close(fd);
  return total;
}

// Completions through the front on a thread, until stopped: how many came
// back right, wrong, or not at all.
class Traffic {
 public:
  explicit Traffic(int port) {
    thread_ = std::thread([this, port] {
      while (!stop_) {
        auto ids = Complete(port);
        if (ids.empty()) {
          ++failed_;
        } else if (ids == kGolden) {
          ++right_;
        } else {
          ++wrong_;
        }
      }
    });
  }
  ~Traffic() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int right() const { return right_; }
  int wrong() const { return wrong_; }
  int failed() const { return failed_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> right_{0}, wrong_{0}, failed_{0};
  std::thread thread_;
};

TEST_CASE("node: a full state disk - every drill says its rows were lost and exits 1, serving stays exact, and the "
          "report after a restart shows the loss",
          "[node]") {
  if (!Have() || SkipWithoutRoot("to mount a small tmpfs as the state_dir")) return;
  Node n;
  Tmpfs disk(n.dir().Join("state"), "24m");
  if (!disk.mounted()) {
    WARN("SKIP: cannot mount a tmpfs: " << disk.error());
    return;
  }
  n.Start();
  REQUIRE(n.WaitServing());
  Traffic traffic(n.FrontPort());
  const std::string fill = n.dir().Join("state/fill");
  REQUIRE(FillUp(fill) > 0);

  // Plain, --kill and --json: each answers that the failover happened, and
  // that the ledger did not record it.
  for (const auto& args : std::vector<std::vector<std::string>>{{"failover", "--drill"},
                                                               {"failover", "--drill", "--kill"},
                                                               {"failover", "--drill", "--json"},
                                                               {"failover", "--drill", "--kill", "--json"}}) {
    REQUIRE(n.WaitServing());
    test::RunResult r;
    // A drill waits for the standby's next passing probe.
    REQUIRE(test::WaitFor(
        [&] {
          r = n.Cli(args);
          return r.output.find("not proven recently") == std::string::npos;
        },
        60s));
    INFO(r.output);
    CHECK(r.exit_code == 1);
    if (args.back() == "--json") {
      auto j = json::parse(r.output);
      CHECK(j.value("ok", false));
      CHECK_FALSE(j.value("recorded", true));
      CHECK(j.value("ledger_error", "").find("full") != std::string::npos);
    } else {
      CHECK(r.output.find("swapped after") != std::string::npos);
      CHECK(r.output.find("the ledger did NOT record this failover") != std::string::npos);
      CHECK(r.output.find("full") != std::string::npos);
    }
  }
  auto st = n.Cli({"status"});
  INFO(st.output);
  CHECK(st.output.find("NOT recorded") != std::string::npos);
  REQUIRE(n.WaitServing());
  traffic.Stop();
  INFO("right " << traffic.right() << ", wrong " << traffic.wrong() << ", failed " << traffic.failed());
  CHECK(traffic.right() > 0);
  CHECK(traffic.wrong() == 0);
  CHECK(traffic.failed() == 0);

  // Room again, and a restart: the loss is still reported.
  REQUIRE(::unlink(fill.c_str()) == 0);
  n.Stop();
  n.Start();
  REQUIRE(n.WaitServing());
  auto report = n.Cli({"report"});
  INFO(report.output);
  CHECK(report.exit_code == 0);
  CHECK(report.output.find("NOT recorded") != std::string::npos);
  CHECK(report.output.find("more NOT recorded") != std::string::npos);
  auto rj = json::parse(n.Cli({"report", "--json"}).output);
  CHECK(rj["lost"]["by_table"].value("failovers", 0) >= 4);
  auto sj = n.Status();
  REQUIRE(sj);
  CHECK((*sj)["ledger_writes"].value("lost_rows", 0) >= 4);
  CHECK((*sj)["ledger_writes"].value("write_errors", -1) == 0);
  // And the ledger records again.
  auto drill = n.Cli({"failover", "--drill", "--json"});
  INFO(drill.output);
  CHECK(drill.exit_code == 0);
  CHECK(json::parse(drill.output).value("recorded", false));
  n.Stop();  // before the tmpfs goes
}

TEST_CASE("node: the ledger deleted under a running supervisor - the next drill is recorded in a ledger that survives "
          "a restart",
          "[node]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  auto before = n.Cli({"failover", "--drill", "--json"});
  INFO(before.output);
  REQUIRE(before.exit_code == 0);
  REQUIRE(n.WaitServing());
  for (const char* f : {"wsup.db", "wsup.db-wal", "wsup.db-shm", "wsup.db-lost"}) {
    ::unlink(n.dir().Join(std::string("state/") + f).c_str());
  }
  test::RunResult drill;
  REQUIRE(test::WaitFor(
      [&] {
        drill = n.Cli({"failover", "--drill", "--json"});
        return drill.output.find("not proven recently") == std::string::npos;
      },
      60s));
  INFO(drill.output);
  REQUIRE(drill.exit_code == 0);
  CHECK(json::parse(drill.output).value("recorded", false));
  auto st = n.Status();
  REQUIRE(st);
  CHECK((*st)["ledger_writes"].value("reopened", "").find("was deleted") != std::string::npos);
  CHECK(n.Log().find("was deleted while the supervisor ran") != std::string::npos);
  // A restart (SIGKILL, then a new supervisor) finds both drills.
  n.sup().Kill(SIGKILL);
  REQUIRE(n.sup().Wait(10s) >= 0);
  n.Start();
  REQUIRE(n.WaitServing());
  auto rows = Query(n.Db(), "SELECT id FROM failovers WHERE drill = 1");
  INFO(rows.Dump());
  CHECK(rows.rows.size() == 2);
  CHECK(Mode(n.Db()) == 0600);
}

// The series names a /metrics text declares (its # TYPE lines).
std::vector<std::string> MetricFamilies(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    out.push_back(line.substr(7, line.find(' ', 7) - 7));
  }
  return out;
}

TEST_CASE("node: /metrics after a failover, a rollout and a front restart passes promtool, and docs/metrics.md names "
          "every series",
          "[node]") {
  if (!Have()) return;
  auto promtool = test::Run({"/bin/sh", "-c", "command -v promtool"}, 10s);
  if (promtool.exit_code != 0) {
    WARN("skipped: promtool is not installed (scripts/setup.sh installs Debian's prometheus package)");
    return;
  }
  Node n({"supervisor.rollout_watch_ms=500"});
  const std::string config = n.dir().Join("node.toml");
  WriteConfigWithToken(config, RandomToken());
  n.UseConfig(config);
  n.Start();
  REQUIRE(n.WaitServing());
  // A rollout, a failover and a front restart: every kind of series has
  // rows.
  WriteConfigWithToken(config, RandomToken());
  auto reload = n.Cli({"reload", "--json"});
  INFO(reload.output);
  REQUIRE(reload.exit_code == 0);
  REQUIRE(n.WaitServing());
  auto drill = n.Cli({"failover", "--drill", "--kill", "--json"});
  INFO(drill.output);
  REQUIRE(drill.exit_code == 0);
  REQUIRE(n.WaitServing());
  const pid_t front = (*n.Status())["front"].value("pid", 0);
  REQUIRE(front > 0);
  REQUIRE(::kill(front, SIGKILL) == 0);
  REQUIRE(n.WaitStatus([&](const json& s) { return s["front"].value("restarts", 0) >= 1; }, 30s));
  REQUIRE(n.WaitServing());
  REQUIRE(!Complete(n.FrontPort()).empty());

  // The front's own counters reach /metrics within a poll or two.
  REQUIRE(test::WaitFor(
      [&] { return test::MetricValue(n.Metrics(), "wsup_front_requests_total") >= 1; }, 10s));
  const std::string text = n.Metrics();
  REQUIRE(!text.empty());
  test::TempDir tmp;
  const std::string file = tmp.Join("metrics.txt");
  std::ofstream(file) << text;
  auto check = test::Run({"/bin/sh", "-c", "promtool check metrics < '" + file + "'"}, 30s);
  INFO(text);
  INFO("promtool check metrics: " << check.output);
  CHECK(check.exit_code == 0);
  CHECK(check.output.empty());

  // What happened is counted.
  auto value = [&](const std::string& series) { return test::MetricValue(text, series); };
  CHECK(value("wsup_rollouts_total{outcome=\"done\"}") == 1);
  CHECK(value("wsup_failovers_total{trigger=\"drill\"}") == 1);
  CHECK(value("wsup_failovers_total{trigger=\"rollout\"}") == 1);  // the reload's planned swap
  CHECK(value("wsup_node_info{node=\"demo\",model=\"llama-tiny-f32\",revision=\"llama-tiny-f32\"}") == 1);
  CHECK(value("wsup_failovers_total{trigger=\"crash\"}") == 0);
  // What the clients saw, through the front, and the engines' load.
  CHECK(value("wsup_front_responses_total{route=\"completions\",code=\"200\"}") >= 1);
  CHECK(value("wsup_front_request_duration_seconds_count{api=\"completions\"}") >= 1);
  CHECK(value("wsup_engine_generation_tokens_total{slot=\"a\"}") +
            value("wsup_engine_generation_tokens_total{slot=\"b\"}") >=
        1);
  CHECK(value("wsup_front_restarts_total") == 1);
  for (const char* phase : {"detect", "swap", "first_answer"}) {
    INFO(phase);
    CHECK(value("wsup_failover_phase_seconds_count{phase=\"" + std::string(phase) + "\"}") >= 1);
  }
  for (const char* slot : {"a", "b"}) {
    INFO(slot);
    double states = 0;
    for (const char* st : {"idle", "starting", "warming", "standby", "active", "draining", "failed", "stopping",
                           "stopped"}) {
      const double v = value("wsup_engine_state{slot=\"" + std::string(slot) + "\",state=\"" + st + "\"}");
      CHECK((v == 0 || v == 1));
      states += v;
    }
    CHECK(states == 1);
    CHECK(value("wsup_engine_transitions_total{slot=\"" + std::string(slot) +
                "\",from_state=\"starting\",to_state=\"warming\"}") >= 1);
  }

  // Every series is in docs/metrics.md, by name, in its tables.
  const std::string doc = test::ReadAll(std::string(WSUP_SOURCE_DIR) + "/docs/metrics.md");
  const std::vector<std::string> families = MetricFamilies(text);
  CHECK(families.size() >= 20);
  for (const auto& f : families) {
    INFO(f);
    CHECK(doc.find("| `" + f + "`") != std::string::npos);
  }
}

}  // namespace
}  // namespace wsup
