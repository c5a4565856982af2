// Bad input against the real `wsup`: control messages of every wrong shape
// on a running supervisor's wsup.sock, the CLI when the supervisor closes
// the connection, configs that cannot work (refused by `wsup check` with a
// located line, and by `wsup start` with exit 78), and a probe expectation
// the model never produces.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/unique_fd.h"
#include "tests/node/node_fixture.h"
#include "testkit/test_util.h"
#include "wire/json_call.h"
#include "wire/json_frame.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using namespace nodetest;

// One connection to a control socket that sends raw bytes and reads one
// framed reply, each bounded.
class RawConn {
 public:
  explicit RawConn(const std::string& path) {
    fd_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    timeval tv{5, 0};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    connected_ = ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  bool connected() const { return connected_; }
  bool Send(const std::string& bytes) {
    return ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  }
  // The reply's body, or nullopt when the connection closed (or nothing
  // came within the socket's 5 s).
  std::optional<json> Reply() {
    std::string head = Read(4);
    if (head.size() != 4) return std::nullopt;
    uint32_t n = 0;
    for (int i = 3; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(head[static_cast<size_t>(i)]);
    std::string body = Read(n);
    if (body.size() != n) return std::nullopt;
    auto j = json::parse(body, nullptr, false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  }

 private:
  std::string Read(size_t n) {
    std::string out;
    char buf[65536];
    while (out.size() < n) {
      ssize_t r = ::recv(fd_.get(), buf, std::min(sizeof buf, n - out.size()), 0);
      if (r <= 0) break;
      out.append(buf, static_cast<size_t>(r));
    }
    return out;
  }
  UniqueFd fd_;
  bool connected_ = false;
};

std::string Frame(const std::string& body) {
  std::string out(4, '\0');
  const auto n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + body;
}

// Random JSON values of every kind, a few levels deep.
json RandomValue(std::mt19937& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 2 ? 6 : 8);
  switch (kind(rng)) {
    case 0: return nullptr;
    case 1: return std::uniform_int_distribution<int>(0, 1)(rng) == 1;
    case 2: return std::uniform_int_distribution<int64_t>(INT64_MIN, INT64_MAX)(rng);
    case 3: return std::uniform_int_distribution<uint64_t>(0, UINT64_MAX)(rng);
    case 4: return std::uniform_real_distribution<double>(-1e300, 1e300)(rng);
    case 5: {
      static const char* words[] = {"status", "failover", "reload", "stop", "event", "", "yes", "true", "3",
                                    "\x01\x7f", "drill", "kill"};
      return words[std::uniform_int_distribution<size_t>(0, 11)(rng)];
    }
    case 6: return std::string(std::uniform_int_distribution<size_t>(0, 300)(rng), 'x');
    case 7: {
      json a = json::array();
      for (int i = std::uniform_int_distribution<int>(0, 3)(rng); i > 0; --i) a.push_back(RandomValue(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int i = std::uniform_int_distribution<int>(0, 3)(rng); i > 0; --i) {
        o[std::string(1, static_cast<char>('a' + i))] = RandomValue(rng, depth + 1);
      }
      return o;
    }
  }
}

// A control message that is no request the supervisor may act on: a type
// of another kind or name, or a failover whose fields are of another type
// or that is no drill; now and then a plain status or reload (which only
// reads the unchanged config again), never a stop or a valid drill.
json GeneratedMessage(std::mt19937& rng) {
  json m = json::object();
  for (int i = std::uniform_int_distribution<int>(0, 3)(rng); i > 0; --i) {
    static const char* keys[] = {"drill", "kill", "n", "epoch", "message", "type2"};
    m[keys[std::uniform_int_distribution<size_t>(0, 5)(rng)]] = RandomValue(rng, 1);
  }
  switch (std::uniform_int_distribution<int>(0, 9)(rng)) {
    case 0:
      m["type"] = "status";
      break;
    case 1:
      m["type"] = "reload";
      break;
    case 2:
    case 3:
    case 4: {
      m["type"] = "failover";
      // Never a drill the supervisor would run: drill or kill of another
      // type, or no drill asked for.
      json drill = RandomValue(rng, 1);
      json kill = RandomValue(rng, 1);
      if (drill.is_boolean() && (kill.is_boolean() || kill.is_null())) drill = false;
      m["drill"] = drill;
      m["kill"] = kill;
      break;
    }
    case 5:
      m.erase("type");
      break;
    default: {
      json t = RandomValue(rng, 1);
      if (t.is_string() && (t == "stop" || t == "failover" || t == "status" || t == "reload")) t = "stop it";
      m["type"] = t;
    }
  }
  return m;
}

TEST_CASE("node: no control message stops the supervisor: fields of another type, 1,000 generated messages and "
          "bad frames each get an error reply, and the node serves on",
          "[node][control]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  const pid_t sup = n.sup().pid();

  // The messages of issue 32, each of which ended the supervisor.
  const std::vector<std::pair<json, std::string>> named = {
      {json{{"type", "failover"}, {"drill", true}, {"kill", 3}}, "field 'kill' is an integer (3), not true or false"},
      {json{{"type", 1}}, "field 'type' is an integer (1), not a string"},
      {json{{"type", "failover"}, {"drill", "yes"}}, "field 'drill' is a string (\"yes\"), not true or false"},
  };
  for (const auto& [msg, words] : named) {
    auto r = JsonCall(n.SupervisorSocket(), msg, 5000);
    INFO(msg.dump());
    REQUIRE(r.ok());
    CHECK(r->value("type", "") == "error");
    CHECK(r->value("message", "").find(words) != std::string::npos);
  }

  std::mt19937 rng(32);
  int errors = 0, statuses = 0, reloads = 0;
  for (int i = 0; i < 1000; ++i) {
    json msg = GeneratedMessage(rng);
    RawConn c(n.SupervisorSocket());
    REQUIRE(c.connected());
    auto frame = EncodeFrame(msg);
    REQUIRE(frame.ok());
    REQUIRE(c.Send(*frame));
    auto reply = c.Reply();
    INFO(i << ": " << msg.dump(-1, ' ', false, json::error_handler_t::replace));
    REQUIRE(reply);
    const std::string type = (*reply)["type"].is_string() ? (*reply)["type"].get<std::string>() : "";
    if (type == "error") {
      ++errors;
      CHECK((*reply)["message"].is_string());
    } else if (type == "status") {
      ++statuses;
    } else {
      CHECK(type == "reload");
      ++reloads;
    }
  }
  CHECK(errors > 500);
  CHECK(statuses > 0);
  CHECK(reloads > 0);

  // Frames that are no message: not JSON, not an object, a zero or huge
  // length. The connection may close; the supervisor stays.
  for (const std::string& bytes : {Frame("{not json"), Frame("[1,2,3]"), Frame("\"status\""), Frame("3"),
                                   std::string("\0\0\0\0", 4), std::string("\xff\xff\xff\x7f", 4) + "x",
                                   Frame(std::string("{\"type\":\"status\"\xff}"))}) {
    RawConn c(n.SupervisorSocket());
    REQUIRE(c.connected());
    c.Send(bytes);
    (void)c.Reply();
  }

  CHECK(::kill(sup, 0) == 0);
  CHECK(n.sup().running());
  auto s = n.Status();
  REQUIRE(s);
  CHECK(s->value("state", "") == "serving");
  CHECK(Complete(n.FrontPort()) == kGolden);
  // Each refusal is counted.
  auto metrics = test::HttpRequestOnce(
      std::atoi(s->value("admin", "").c_str() + s->value("admin", "").rfind(':') + 1), "GET", "/metrics", "", 5s);
  std::smatch m;
  static const std::regex counted(R"(wsup_bad_messages_total\{from="control"\} ([0-9]+))");
  REQUIRE(std::regex_search(metrics.body, m, counted));
  CHECK(std::stoi(m[1]) >= errors + 3);
}

// A stand-in for the supervisor on a control socket: takes one request,
// then answers `reply` (a JSON body), or closes with no answer when it is
// empty, as a supervisor that dies mid-call does.
class OneShotServer {
 public:
  OneShotServer(const std::string& path, std::string reply) {
    listener_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    REQUIRE(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener_.get(), 4) == 0);
    thread_ = std::thread([this, reply = std::move(reply)] {
      UniqueFd c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      timeval tv{10, 0};
      ::setsockopt(c.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      char buf[4096];
      (void)::recv(c.get(), buf, sizeof buf, 0);
      if (!reply.empty()) {
        const std::string frame = Frame(reply);
        (void)::send(c.get(), frame.data(), frame.size(), MSG_NOSIGNAL);
      }
    });
  }
  ~OneShotServer() { thread_.join(); }

 private:
  UniqueFd listener_;
  std::thread thread_;
};

TEST_CASE("wsup: a supervisor that closes the connection mid-call is named, not the holder", "[node][control]") {
  test::TempDir dir;
  const std::string path = dir.Join("wsup.sock");
  test::RunResult r;
  {
    OneShotServer dies(path, "");
    r = test::Run({test::BinPath("wsup"), "status", "--socket", path}, 30s);
  }
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find(path + ": the supervisor closed the connection") != std::string::npos);
  CHECK(r.output.find("holder") == std::string::npos);
}

TEST_CASE("wsup: a supervisor's answer with fields of another type is printed as far as it can be, and says so",
          "[node][control]") {
  test::TempDir dir;
  const std::string path = dir.Join("wsup.sock");
  test::RunResult r;
  {
    OneShotServer odd(path, R"({"type":"status","node":"n1","state":3,"engines":"none","front":{"pid":"x"}})");
    r = test::Run({test::BinPath("wsup"), "status", "--socket", path}, 30s);
  }
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("node n1: ?") != std::string::npos);
  CHECK(r.output.find("part of the supervisor's answer could not be read: field 'state' is an integer (3), not a "
                      "string; run the same wsup version as the supervisor") != std::string::npos);
  CHECK(r.output.find("json.exception") == std::string::npos);
}

// A located config error: FILE:LINE:COL: KEY: what.
bool Located(const std::string& output, const std::string& key) {
  std::regex form("[^:\\s]+:[0-9]+:[0-9]+: " + key + ": [^\n]+");
  return std::regex_search(output, form);
}

// Runs a `wsup` command line of node n to its end (bounded), tagged as the
// node's process so that anything it leaves running is found.
test::RunResult RunTagged(const Node& n, const std::vector<std::string>& argv) {
  const std::string log = n.dir().Join("run.log");
  ::unlink(log.c_str());
  auto c = test::Child::Start(argv, log, {}, {{"WSUP_TEST_NODE", n.dir().path()}});
  test::RunResult r;
  if (c.Wait(30s) < 0) {
    c.Kill(SIGKILL);
    c.Wait(5s);
  } else {
    r.exit_code = c.exit_code();
  }
  r.output = test::ReadAll(log);
  return r;
}

TEST_CASE("node: each config that cannot work is refused by wsup check with a located line, and wsup start exits 78 "
          "before starting anything",
          "[node][config]") {
  if (!Have()) return;
  struct Bad {
    const char* name;
    std::vector<std::string> sets;
    std::string key;
    std::string words;
  };
  test::TempDir scratch;
  REQUIRE(::symlink(scratch.Join("b").c_str(), scratch.Join("a").c_str()) == 0);
  REQUIRE(::symlink(scratch.Join("a").c_str(), scratch.Join("b").c_str()) == 0);
  std::vector<int> wrong_ids(kGolden.rbegin(), kGolden.rend());
  wrong_ids[0] = 300;
  const std::vector<Bad> bad = {
      {"socket paths past sun_path", {"node.runtime_dir=" + scratch.Join(std::string(100, 'r'))}, "node.runtime_dir",
       "a Unix socket path may have"},
      {"tp 3 on a model with 4 heads", {"parallel.tp=3"}, "parallel.tp", "tp sizes this checkpoint can use: 1, 2, 4"},
      {"probe ids outside the vocabulary", {"probe.expect_token_ids=" + json(wrong_ids).dump()},
       "probe.expect_token_ids", "outside the vocabulary"},
      {"a probe prompt longer than the context", {"probe.prompt=" + std::string(600, 'p')}, "probe.prompt",
       "context is 512 tokens"},
      {"a symbolic link loop as state_dir", {"node.state_dir=" + scratch.Join("a")}, "node.state_dir",
       "symbolic link loop"},
      {"a file as state_dir", {"node.state_dir=/dev/null"}, "node.state_dir", "is not a folder"},
  };
  for (const auto& b : bad) {
    SECTION(b.name) {
      Node n(b.sets);
      auto check = RunTagged(n, n.Argv("check"));
      INFO(check.output);
      CHECK(check.exit_code == 1);
      CHECK(Located(check.output, b.key));
      CHECK(check.output.find(b.words) != std::string::npos);
      auto start = RunTagged(n, n.Argv("start"));
      INFO(start.output);
      CHECK(start.exit_code == kExitConfig);
      CHECK(Located(start.output, b.key));
      CHECK(n.Processes().empty());
    }
  }
}

TEST_CASE("node: a group member's config passes wsup check, and wsup start refuses it before starting anything",
          "[node][config]") {
  if (!Have()) return;
  Node n({"group.name=g", "group.index=0", "group.size=2", "group.etcd=[\"http://127.0.0.1:2379\"]"});
  auto check = RunTagged(n, n.Argv("check"));
  INFO(check.output);
  CHECK(check.exit_code == 0);
  CHECK(check.output.find("group g: member 0 of 2") != std::string::npos);
  auto start = RunTagged(n, n.Argv("start"));
  INFO(start.output);
  CHECK(start.exit_code == kExitConfig);
  CHECK(Located(start.output, "group"));
  CHECK(start.output.find("remove [group] to run this node alone") != std::string::npos);
  CHECK(n.Processes().empty());
}

TEST_CASE("node: a state folder on a read-only filesystem: wsup start exits 78, located", "[node][config]") {
  if (!Have()) return;
  Node n;
  REQUIRE(MakeDirs(n.dir().Join("ro"), 0755).ok());
  auto argv = n.Argv("start");
  argv.push_back("--set");
  argv.push_back("node.state_dir=" + n.dir().Join("ro/state"));
  const std::string log = n.dir().Join("start.log");
  int code = test::RunWithReadOnlyMount(
      n.dir().Join("ro"),
      [&] {
        std::FILE* out = std::freopen(log.c_str(), "w", stdout);
        if (!out || ::dup2(::fileno(stdout), 2) < 0) return 2;
        ::setenv("WSUP_TEST_NODE", n.dir().path().c_str(), 1);
        std::vector<char*> args;
        for (auto& s : argv) args.push_back(s.data());
        args.push_back(nullptr);
        ::execv(args[0], args.data());
        return 127;
      },
      30s);
  if (code == test::kNoReadOnlyMount) {
    WARN("SKIP: this machine lets no test mount a read-only filesystem (no mount or user namespaces)");
    return;
  }
  const std::string output = test::ReadAll(log);
  INFO(output);
  CHECK(code == kExitConfig);
  CHECK(Located(output, "node.state_dir"));
  CHECK(output.find(n.dir().Join("ro") + " is on a read-only filesystem") != std::string::npos);
  CHECK(n.Processes().empty());
}

TEST_CASE("node: a probe expectation the model does not produce stops the node with exit 78, expected and actual "
          "tokens named, instead of restarting engines",
          "[node][config]") {
  if (!Have()) return;
  // Valid ids, the golden answer's own, in the wrong order: only the
  // model's answer can show it is wrong.
  std::vector<int> wrong(kGolden.rbegin(), kGolden.rend());
  Node n({"probe.expect_token_ids=" + json(wrong).dump()});
  REQUIRE(RunTagged(n, n.Argv("check")).exit_code == 0);
  n.Start();
  REQUIRE(n.sup().Wait(60s) >= 0);
  const std::string log = n.Log();
  INFO(log);
  CHECK(n.sup().exit_code() == kExitConfig);
  // What the model answers (the golden ids) and what the config expects.
  CHECK(log.find("both engines answer the probe's prompt with [92, 16, 97, 246, 28") != std::string::npos);
  CHECK(log.find("where probe.expect_token_ids is [118, 232, 48, 188, 216") != std::string::npos);
  CHECK(Located(log, "probe.expect_token_ids"));
  // Everything it started was stopped on the way out.
  CHECK(test::WaitFor([&] { return n.Processes().empty(); }, 10s));
}

}  // namespace
}  // namespace wsup
