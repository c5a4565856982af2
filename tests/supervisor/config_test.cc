// Config: the shipped configs load; every malformed config gives one error of
// the form FILE:LINE:COL: KEY: ..., naming the key, and nothing crashes.
#include "supervisor/config.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

const char* kBase = R"([node]
name = "t"
state_dir = "state"
runtime_dir = "run"

[model]
path = "model"

[engine]
command = ["eng", "--port", "{port}"]
primary_port = 8001
standby_port = 8002

[probe]
prompt = "Hello"
expect = "world"
max_tokens = 4
interval_ms = 1000
timeout_ms = 500
failures = 3

[front]
listen = "127.0.0.1:8000"

[admin]
listen = "127.0.0.1:9090"
)";

// kBase with the first occurrence of `from` replaced by `to`.
std::string Edit(const std::string& from, const std::string& to) {
  std::string s = kBase;
  size_t at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

std::string Add(const std::string& after, const std::string& line) { return Edit(after, after + "\n" + line); }

struct ErrorForm {
  std::string file;
  int line = 0;
  int col = 0;
  std::string key;
  std::string what;
};

// Splits a message of the contract form; fails the test when it has another form.
ErrorForm Split(const std::string& message) {
  static const std::regex form(R"(^([^:\n]+):([0-9]+):([0-9]+): ([A-Za-z0-9_.\-]+): (.+)$)");
  std::smatch m;
  INFO(message);
  REQUIRE(std::regex_match(message, m, form));
  return {m[1], std::stoi(m[2]), std::stoi(m[3]), m[4], m[5]};
}

struct BadCase {
  const char* name;
  std::string text;
  std::vector<std::string> overrides;
  std::string key;    // the key the error must name
  int line;           // expected line, 0: do not check
  std::string words;  // a phrase the explanation must contain
};

std::vector<BadCase> BadCases() {
  return {
      // TOML syntax
      {"value missing", Edit("failures = 3", "failures = "), {}, "probe.failures", 20, "TOML syntax error"},
      {"unterminated header", Edit("[probe]", "[probe"), {}, "probe", 14, "TOML syntax error"},
      {"unterminated string", Edit("name = \"t\"", "name = \"t"), {}, "node.name", 2, "TOML syntax error"},
      {"duplicate key", Add("failures = 3", "failures = 4"), {}, "probe.failures", 21, "redefine"},
      {"duplicate section", Add("listen = \"127.0.0.1:9090\"", "[front]"), {}, "front", 27, "TOML syntax error"},
      {"not toml at all", std::string("\x01\x02 binary\xff\xfe", 12), {}, "syntax", 1, "TOML syntax error"},
      // unknown names
      {"unknown section", Edit("[probe]", "[prbe]"), {}, "prbe", 14, "did you mean [probe]"},
      {"unknown key", Edit("failures = 3", "failurs = 3"), {}, "probe.failurs", 20, "did you mean failures"},
      {"key outside a section", "failures = 3\n" + std::string(kBase), {}, "failures", 1, "probe.failures"},
      {"array of tables", Edit("[probe]", "[[probe]]"), {}, "probe", 14, "not [[probe]]"},
      {"section as a value", Edit("[node]\nname = \"t\"\nstate_dir = \"state\"\nruntime_dir = \"run\"", "node = 5"), {},
       "node", 1, "expected a section"},
      // types
      {"quoted integer", Edit("failures = 3", "failures = \"3\""), {}, "probe.failures", 20, "without quotes"},
      {"float for ms", Edit("interval_ms = 1000", "interval_ms = 1.5"), {}, "probe.interval_ms", 18, "got a float"},
      {"command as a string", Edit("command = [\"eng\", \"--port\", \"{port}\"]", "command = \"eng --port {port}\""), {},
       "engine.command", 10, "an array of strings"},
      {"command element not a string", Edit("[\"eng\", \"--port\", \"{port}\"]", "[\"eng\", \"--port\", 8001]"), {},
       "engine.command", 10, "element 3"},
      {"env value not a string", Add("standby_port = 8002", "env = { A = 1 }"), {}, "engine.env.A", 13, "quote it"},
      {"boolean as string", Add("failures = 3", "comm = \"true\""), {}, "probe.comm", 21, "without quotes"},
      // missing
      {"missing section", Edit("[front]\nlisten = \"127.0.0.1:8000\"\n", ""), {}, "front", 1, "missing required section"},
      {"empty file", "", {}, "node", 1, "missing required section"},
      {"missing key", Edit("name = \"t\"\n", ""), {}, "node.name", 1, "missing"},
      {"missing model path", Edit("path = \"model\"", "revision = \"r\""), {}, "model.path", 6, "missing"},
      {"missing answer", Edit("expect = \"world\"\n", ""), {}, "probe.expect", 14, "expect_token_ids"},
      // addresses
      {"listen without port", Edit("127.0.0.1:8000", "127.0.0.1"), {}, "front.listen", 23, "no :PORT"},
      {"listen port too big", Edit("127.0.0.1:8000", "127.0.0.1:70000"), {}, "front.listen", 23, "out of range"},
      {"ipv6 without brackets", Edit("127.0.0.1:8000", "::1:8000"), {}, "front.listen", 23, "without brackets"},
      {"bad ipv4", Edit("127.0.0.1:9090", "300.1.1.1:9090"), {}, "admin.listen", 26, "not an IPv4 address"},
      {"bracket without colon", Edit("127.0.0.1:9090", "[::1]9090"), {}, "admin.listen", 26, "no :PORT"},
      {"bad ipv6 in brackets", Edit("127.0.0.1:9090", "[::zz]:9090"), {}, "admin.listen", 26, "not an IPv6"},
      {"port not a number", Edit("127.0.0.1:9090", "127.0.0.1:http"), {}, "admin.listen", 26, "not a number"},
      // impossible values
      {"tp zero", Add("path = \"model\"", "[parallel]\ntp = 0"), {}, "parallel.tp", 9, "out of range"},
      {"cuda devices != tp",
       Add("path = \"model\"", "[parallel]\ntp = 2\ndevices = [0]\n[weight_cache]\nbackend = \"cuda\""), {},
       "parallel.devices", 10, "one device per rank"},
      {"duplicate device", Add("path = \"model\"", "[parallel]\ntp = 2\ndevices = [1, 1]"), {}, "parallel.devices", 10,
       "twice"},
      {"failures zero", Edit("failures = 3", "failures = 0"), {}, "probe.failures", 20, "out of range"},
      {"timeout above interval", Edit("timeout_ms = 500", "timeout_ms = 1500"), {}, "probe.timeout_ms", 19,
       "never overlap"},
      {"jitter negative", Add("failures = 3", "jitter_ms = -5"), {}, "probe.jitter_ms", 21, "out of range"},
      {"same engine ports", Edit("standby_port = 8002", "standby_port = 8001"), {}, "engine.standby_port", 12,
       "different ports"},
      {"engine port negative", Edit("primary_port = 8001", "primary_port = -1"), {}, "engine.primary_port", 11,
       "out of range"},
      {"engine port too large", Edit("primary_port = 8001", "primary_port = 70000"), {}, "engine.primary_port", 11,
       "out of range"},
      {"front on an engine port", Edit("127.0.0.1:8000", "127.0.0.1:8002"), {}, "front.listen", 23, "an engine uses"},
      {"admin on the front port", Edit("127.0.0.1:9090", "127.0.0.1:8000"), {}, "admin.listen", 26, "same port"},
      {"empty command", Edit("[\"eng\", \"--port\", \"{port}\"]", "[]"), {}, "engine.command", 10, "is empty"},
      {"command without port", Edit("[\"eng\", \"--port\", \"{port}\"]", "[\"eng\"]"), {}, "engine.command", 10,
       "no {port}"},
      {"unknown placeholder", Edit("\"{port}\"]", "\"{port}\", \"{prot}\"]"), {}, "engine.command", 10,
       "unknown placeholder {prot}"},
      {"mode not allowed", Add("path = \"model\"", "[weight_cache]\nmode = \"deamon\""), {}, "weight_cache.mode", 9,
       "did you mean daemon"},
      {"backend not allowed", Add("path = \"model\"", "[weight_cache]\nbackend = \"gpu\""), {}, "weight_cache.backend",
       9, "allowed: host, cuda"},
      {"both answers", Add("expect = \"world\"", "expect_token_ids = [1, 2]"), {}, "probe.expect_token_ids", 17,
       "exactly one"},
      {"ids longer than max_tokens", Edit("expect = \"world\"", "expect_token_ids = [1, 2, 3, 4, 5]"), {},
       "probe.expect_token_ids", 16, "never match"},
      {"negative token id", Edit("expect = \"world\"", "expect_token_ids = [1, -2]"), {}, "probe.expect_token_ids",
       16, "element 2"},
      {"bad log level", Add("listen = \"127.0.0.1:9090\"", "[supervisor]\nlog_level = \"verbose\""), {},
       "supervisor.log_level", 28, "allowed: trace"},
      {"backoff max below min",
       Add("listen = \"127.0.0.1:9090\"", "[supervisor]\nrestart_backoff_ms = 5000\nrestart_backoff_max_ms = 10"), {},
       "supervisor.restart_backoff_max_ms", 29, "at least restart_backoff_ms"},
      {"holder binary and command",
       Add("listen = \"127.0.0.1:9090\"", "[holder]\nbinary = \"h\"\ncommand = [\"h\", \"{rank}\"]"), {},
       "holder.command", 29, "set one"},
      {"same state and runtime dir", Edit("runtime_dir = \"run\"", "runtime_dir = \"state\""), {}, "node.runtime_dir", 4,
       "two folders"},
      {"bad node name", Edit("name = \"t\"", "name = \"a b\""), {}, "node.name", 2, "plain name"},
      {"newline in a value stays one line", Edit("name = \"t\"", "name = \"a\\nb\""), {}, "node.name", 2,
       "\"a\\x0ab\""},
      {"mode with a newline", Add("path = \"model\"", "[weight_cache]\nmode = \"off\\n\""), {}, "weight_cache.mode",
       9, "\"off\\x0a\" is not allowed"},
      // [kv]
      {"kv pool negative", Add("listen = \"127.0.0.1:9090\"", "[kv]\npool_mib = -1"), {}, "kv.pool_mib", 28,
       "out of range; allowed: an integer from 0 to 16777216"},
      {"kv pool past 16 TiB", Add("listen = \"127.0.0.1:9090\"", "[kv]\npool_mib = 16777217"), {}, "kv.pool_mib", 28,
       "out of range"},
      {"kv pool quoted", Add("listen = \"127.0.0.1:9090\"", "[kv]\npool_mib = \"8\""), {}, "kv.pool_mib", 28,
       "without quotes"},
      {"kv scratch zero", Add("listen = \"127.0.0.1:9090\"", "[kv]\nscratch_mib = 0"), {}, "kv.scratch_mib", 28,
       "allowed: an integer from 1 to 1048576"},
      {"kv scratch past 1 TiB", Add("listen = \"127.0.0.1:9090\"", "[kv]\nscratch_mib = 1048577"), {},
       "kv.scratch_mib", 28, "out of range"},
      {"kv pool without holders",
       Add("listen = \"127.0.0.1:9090\"", "[kv]\npool_mib = 8\n[weight_cache]\nmode = \"off\""), {},
       "kv.pool_mib", 28, "needs holders to make the pool"},
      {"kv unknown key", Add("listen = \"127.0.0.1:9090\"", "[kv]\npool_mb = 8"), {}, "kv.pool_mb", 28,
       "did you mean pool_mib"},
      {"kv as a value", "kv = 8\n" + std::string(kBase), {}, "kv", 1, "expected a section [kv]"},
      {"set kv pool without the daemon mode", kBase, {"weight_cache.mode=off", "kv.pool_mib=8"}, "kv.pool_mib", 2,
       "leave pool_mib out"},
      // [front] hedging
      {"hedge after negative", kBase, {"front.hedge_after_ms=-1"}, "front.hedge_after_ms", 1,
       "out of range; allowed: an integer from 0 to 3600000"},
      {"hedge percent past 100", kBase, {"front.hedge_percent=101"}, "front.hedge_percent", 1,
       "allowed: an integer from 0 to 100"},
      {"hedge burst zero", kBase, {"front.hedge_burst=0"}, "front.hedge_burst", 1, "allowed: an integer from 1 to"},
      {"hedge share as a fraction", kBase, {"front.hedge_percent=0.1"}, "front.hedge_percent", 1, "an integer"},
      {"hedge every request", kBase, {"front.hedge_percent=100"}, "front.hedge_percent", 1, "give at most 50"},
      {"hedge most requests", kBase, {"front.hedge_percent=51"}, "front.hedge_percent", 1, "starves the standby"},
      {"front loops past 64", kBase, {"front.loops=65"}, "front.loops", 1, "allowed: an integer from 0 to 64"},
      {"front loops negative", kBase, {"front.loops=-1"}, "front.loops", 1, "allowed: an integer from 0 to 64"},
      // Unix socket paths: sun_path holds 107 bytes. The longest of
      // runtime_dir's sockets is holder.sock (12 bytes with the '/').
      {"runtime dir too long for its sockets", kBase, {"node.runtime_dir=/" + std::string(96, 'r')},
       "node.runtime_dir", 1,
       "the front's control socket /" + std::string(96, 'r') +
           "/front.sock is 108 bytes, longer than the 107 a Unix socket path may have; choose a runtime_dir of at "
           "most 95 bytes (it is 97)"},
      {"runtime dir in the file too long", Edit("runtime_dir = \"run\"", "runtime_dir = \"/" + std::string(110, 'r') + "\""),
       {}, "node.runtime_dir", 4, "the supervisor's control socket"},
      {"control socket too long", kBase, {"supervisor.control_socket=/" + std::string(110, 'c')},
       "supervisor.control_socket", 1, "is 111 bytes, longer than the 107 a Unix socket path may have; give a path of "
       "at most 107 bytes"},
      {"the last holder's socket too long", kBase, {"parallel.tp=8", "weight_cache.socket=/" + std::string(105, 'h')},
       "weight_cache.socket", 2, "the last holder's socket /" + std::string(105, 'h') + ".7 is 108 bytes"},
      // --set
      {"set without =", kBase, {"probe.failures"}, "probe.failures", 1, "has no '='"},
      {"set unknown key", kBase, {"probe.failurs=3"}, "probe.failurs", 1, "did you mean failures"},
      {"set wrong type", kBase, {"probe.failures=abc"}, "probe.failures", 1, "an integer"},
      {"set without section", kBase, {"failures=3"}, "failures", 1, "probe.failures"},
      {"set unknown section", kBase, {"prob.failures=2"}, "prob", 1, "did you mean [probe]"},
      {"set second bad", kBase, {"probe.failures=4", "front.listen=nowhere"}, "front.listen", 2, "no :PORT"},
      {"set into a value", kBase, {"probe.failures.x=1"}, "probe.failures.x", 1, "not a section"},
      {"set empty value", kBase, {"node.name="}, "node.name", 1, "no value"},
      // A JSON string of an emoji: TOML has no surrogate escapes. Taken as
      // text it would keep its quotes and backslashes.
      {"set a JSON string with surrogate escapes", kBase, {"probe.prompt=\"\\ud83d\\ude42\""}, "probe.prompt", 1,
       "the value is not TOML"},
      {"set an unclosed array", kBase, {"engine.command=[\"a\""}, "engine.command", 1, "the value is not TOML"},
      {"set impossible value", kBase, {"probe.timeout_ms=5000"}, "probe.timeout_ms", 1, "never overlap"},
  };
}

TEST_CASE("config: malformed configs give FILE:LINE:COL: KEY errors", "[config]") {
  auto cases = BadCases();
  REQUIRE(cases.size() >= 30);
  for (const auto& c : cases) {
    SECTION(c.name) {
      auto r = ParseConfig(c.text, "/etc/wsup/bad.toml", c.overrides);
      REQUIRE_FALSE(r.ok());
      CHECK(r.error().code() == Code::kInvalidArgument);
      ErrorForm e = Split(r.error().message());
      INFO(r.error().message());
      CHECK(e.key == c.key);
      if (c.overrides.empty()) {
        CHECK(e.file == "/etc/wsup/bad.toml");
      } else {
        CHECK(e.file == "--set");
      }
      if (c.line) CHECK(e.line == c.line);
      CHECK(e.what.find(c.words) != std::string::npos);
    }
  }
}

TEST_CASE("config: an engine.env value of the wrong type is refused without showing it", "[config]") {
  // engine.env holds secrets: an error names the key, never the value.
  for (const char* line : {"env = { HF_TOKEN = 987654321 }", "env = { HF_TOKEN = [\"hf_secret_x\"] }",
                           "env = \"HF_TOKEN=hf_secret_x\""}) {
    INFO(line);
    auto r = ParseConfig(Add("standby_port = 8002", line), "/etc/wsup/bad.toml");
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message());
    CHECK(r.error().message().find("engine.env") != std::string::npos);
    CHECK(r.error().message().find("987654321") == std::string::npos);
    CHECK(r.error().message().find("hf_secret_x") == std::string::npos);
  }
}

TEST_CASE("config: --set columns point at the key or at the value", "[config]") {
  auto r = ParseConfig(kBase, "c.toml", {"node.name=a", "probe.failures=abc"});
  REQUIRE_FALSE(r.ok());
  ErrorForm e = Split(r.error().message());
  CHECK(e.file == "--set");
  CHECK(e.line == 2);
  CHECK(e.col == 16);  // the 'a' of abc
  r = ParseConfig(kBase, "c.toml", {"probe.failurs=3"});
  REQUIRE_FALSE(r.ok());
  CHECK(Split(r.error().message()).col == 1);
}

TEST_CASE("config: a file error is reported at its line and column", "[config]") {
  auto r = ParseConfig(Edit("failures = 3", "failures = 0"), "c.toml");
  REQUIRE_FALSE(r.ok());
  ErrorForm e = Split(r.error().message());
  CHECK(e.line == 20);
  CHECK(e.col == 12);
  // An unknown key points at the key itself.
  r = ParseConfig(Edit("failures = 3", "  failurs = 3"), "c.toml");
  REQUIRE_FALSE(r.ok());
  e = Split(r.error().message());
  CHECK(e.line == 20);
  CHECK(e.col == 3);
}

TEST_CASE("config: a missing or unreadable file names the path", "[config]") {
  test::TempDir dir;
  auto r = LoadConfig(dir.Join("nope.toml"));
  REQUIRE_FALSE(r.ok());
  ErrorForm e = Split(r.error().message());
  CHECK(e.file == dir.Join("nope.toml"));
  CHECK(e.key == "file");
  r = LoadConfig(dir.path());  // a directory
  REQUIRE_FALSE(r.ok());
  Split(r.error().message());
}

TEST_CASE("config: every prefix of demo.toml gives a config or a well-formed error", "[config]") {
  auto text = ReadFile(std::string(WSUP_SOURCE_DIR) + "/config/demo.toml");
  REQUIRE(text.ok());
  int errors = 0;
  for (size_t n = 0; n <= text->size(); n += 3) {
    auto r = ParseConfig(std::string_view(*text).substr(0, n), "demo.toml");
    if (!r.ok()) {
      ++errors;
      Split(r.error().message());
    }
  }
  CHECK(errors > 0);
}

TEST_CASE("config: demo.toml loads and matches the golden answer", "[config]") {
  std::string path = std::string(WSUP_SOURCE_DIR) + "/config/demo.toml";
  auto r = LoadConfig(path);
  INFO((r.ok() ? "" : r.error().message()));
  REQUIRE(r.ok());
  const Config& c = *r;
  namespace fs = std::filesystem;
  // Relative to the config's folder: the repository's testdata/, wherever
  // this build's test checkpoints are (-DWSUP_TESTDATA_DIR may point elsewhere).
  CHECK(fs::weakly_canonical(c.model.path) ==
        fs::weakly_canonical(fs::path(WSUP_SOURCE_DIR) / "testdata/llama-tiny-f32"));
  CHECK(c.weight_cache.mode == CacheMode::kDaemon);
  CHECK(c.weight_cache.backend == CacheBackend::kHost);
  CHECK(c.parallel.tp == 1);
  CHECK(c.probe.prompt == "Hello, world");
  CHECK(c.probe.max_tokens == 16);
  REQUIRE(c.probe.expect_token_ids.has_value());
  CHECK_FALSE(c.probe.expect.has_value());
  CHECK(c.front.listen.host == "127.0.0.1");
  CHECK(c.admin.listen.host == "127.0.0.1");
  CHECK(c.engine.host == "127.0.0.1");
  CHECK(c.engine.command[0] == fs::path(WSUP_SOURCE_DIR).lexically_normal().string() + "/build/bin/wsup-engine");
  if (test::HaveTestData("llama-tiny-f32")) {
    auto golden = ReadFile(test::TestData("llama-tiny-f32/golden.json"));
    REQUIRE(golden.ok());
    auto j = nlohmann::json::parse(*golden);
    CHECK(j["cases"][0]["prompt"].get<std::string>() == c.probe.prompt);
    CHECK(j["cases"][0]["output_ids"].get<std::vector<int64_t>>() == *c.probe.expect_token_ids);
  }
  auto argv = EngineArgv(c, 18001);
  REQUIRE(argv.ok());
  std::vector<std::string> want = {c.engine.command[0], "--model", c.model.path, "--port", "18001", "--weight-cache",
                                   "daemon", "--socket", c.weight_cache.socket, "--device", "cpu",
                                   "--revision", "llama-tiny-f32", "--kv-pool", "--kv-scratch-mib", "2"};
  CHECK(*argv == want);
  // The demo node keeps a KV pool: the active engine's KV.
  CHECK(c.kv.pool_mib == 16);
  CHECK(c.kv.scratch_mib == 2);
}

TEST_CASE("config: ling.toml loads", "[config]") {
  auto r = LoadConfig(std::string(WSUP_SOURCE_DIR) + "/config/ling.toml");
  INFO((r.ok() ? "" : r.error().message()));
  REQUIRE(r.ok());
  CHECK(r->parallel.tp == 8);
  CHECK(r->parallel.devices == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(r->weight_cache.mode == CacheMode::kClient);
  CHECK(r->weight_cache.backend == CacheBackend::kCuda);
  CHECK(r->model.path.front() == '/');
  CHECK(r->probe.expect.has_value());
  CHECK(r->probe.comm);
  CHECK(DevicesArg(*r) == "cuda:0,1,2,3,4,5,6,7");
  CHECK(r->engine.env.size() == 2);
}

TEST_CASE("config: ling.toml is a block-FP8 MoE at TP 8 with expert parallelism, and wsup check --no-paths passes it",
          "[config]") {
  const std::string path = std::string(WSUP_SOURCE_DIR) + "/config/ling.toml";
  auto r = LoadConfig(path);
  INFO((r.ok() ? "" : r.error().message()));
  REQUIRE(r.ok());
  CHECK(r->parallel.tp == 8);
  CHECK(r->parallel.expert_parallel);
  CHECK(r->parallel.ep() == 8);
  // Every rank's holder partitions the experts with its own rank.
  for (int rank : {0, 7}) {
    auto h = HolderArgv(*r, rank, "/usr/local/bin/wsup-holder");
    REQUIRE(h.ok());
    auto ep = std::find(h->begin(), h->end(), "--ep-size");
    REQUIRE(ep != h->end());
    REQUIRE(ep + 3 < h->end());
    CHECK(*(ep + 1) == "8");
    CHECK(*(ep + 2) == "--ep-rank");
    CHECK(*(ep + 3) == std::to_string(rank));
    CHECK(std::find(h->begin(), h->end(), "cuda") != h->end());
  }
  // The engines are told the EP size too.
  auto e = EngineArgv(*r, 8001);
  REQUIRE(e.ok());
  auto eep = std::find(e->begin(), e->end(), "--ep-size");
  REQUIRE(eep != e->end());
  REQUIRE(eep + 1 < e->end());
  CHECK(*(eep + 1) == "8");
  // The file says what it is written for.
  std::string text = test::ReadAll(path);
  CHECK(text.find("DeepseekV3ForCausalLM") != std::string::npos);
  CHECK(text.find("128x128") != std::string::npos);
  CHECK(text.find("expert_parallel = true") != std::string::npos);
  // `wsup check --no-paths` (its model.path is a placeholder on this machine).
  auto c = CheckConfig(path, {}, /*check_paths=*/false);
  INFO(c.output);
  CHECK(c.exit_code == 0);
  CHECK(c.output.find("(paths not checked: --no-paths)") != std::string::npos);
  CHECK(c.output.find("parallel: tp 8 (experts: ep 8)") != std::string::npos);
}

TEST_CASE("config: defaults, relative paths and overrides", "[config]") {
  auto r = ParseConfig(kBase, "/srv/wsup/conf/node.toml",
                       {"probe.failures=5", "node.name=other", "engine.command=[\"./bin/e\", \"-p\", \"{port}\"]",
                        "probe.comm=true", "engine.env.FOO=bar"});
  INFO((r.ok() ? "" : r.error().message()));
  REQUIRE(r.ok());
  const Config& c = *r;
  CHECK(c.path == "/srv/wsup/conf/node.toml");
  CHECK(c.node.state_dir == "/srv/wsup/conf/state");
  CHECK(c.node.runtime_dir == "/srv/wsup/conf/run");
  CHECK(c.model.path == "/srv/wsup/conf/model");
  CHECK(c.weight_cache.socket == "/srv/wsup/conf/run/holder.sock");
  CHECK(c.supervisor.control_socket == "/srv/wsup/conf/run/wsup.sock");
  CHECK(c.probe.failures == 5);
  CHECK(c.probe.successes == 2);
  CHECK(c.probe.comm);
  CHECK(c.node.name == "other");
  CHECK(c.engine.command == std::vector<std::string>{"/srv/wsup/conf/bin/e", "-p", "{port}"});
  CHECK(c.engine.env == std::vector<std::pair<std::string, std::string>>{{"FOO", "bar"}});
  CHECK(c.parallel.tp == 1);
  CHECK(c.weight_cache.mode == CacheMode::kDaemon);
  CHECK(c.weight_cache.backend == CacheBackend::kHost);
  CHECK(c.probe.kind == ProbeKind::kSemantic);
  CHECK(c.probe.expect == std::optional<std::string>("world"));
  CHECK(c.supervisor.max_restarts == 5);
  CHECK(c.holder.binary.empty());
  auto h = HolderArgv(c, 0, "/opt/wsup/bin/wsup-holder");
  REQUIRE(h.ok());
  CHECK(h->front() == "/opt/wsup/bin/wsup-holder");
  CHECK(std::find(h->begin(), h->end(), "{rank}") == h->end());
  CHECK_FALSE(HolderArgv(c, 1, "x").ok());
}

TEST_CASE("config: weight_cache.layout engine starts holders with no checkpoint - its rules are checked",
          "[config]") {
  auto def = ParseConfig(kBase, "/srv/c.toml");
  REQUIRE(def.ok());
  CHECK(def->weight_cache.layout == CacheLayout::kCheckpoint);
  auto r = ParseConfig(kBase, "/srv/c.toml",
                       {"weight_cache.layout=engine", "model.revision=r7",
                        "engine.command=[\"e\", \"--port\", \"{port}\", \"--layout\", \"{layout}\"]"});
  INFO((r.ok() ? "" : r.error().message()));
  REQUIRE(r.ok());
  CHECK(r->weight_cache.layout == CacheLayout::kEngine);
  auto h = HolderArgv(*r, 0, "/opt/wsup/bin/wsup-holder");
  REQUIRE(h.ok());
  CHECK(std::find(h->begin(), h->end(), "--model") == h->end());
  auto layout = std::find(h->begin(), h->end(), "--layout");
  REQUIRE(layout != h->end());
  CHECK(*(layout + 1) == "engine");
  CHECK(std::find(h->begin(), h->end(), "r7") != h->end());
  auto e = EngineArgv(*r, 8001);
  REQUIRE(e.ok());
  CHECK(e->back() == "engine");
  CHECK(DescribeConfig(*r).find("layout engine") != std::string::npos);
  // No cap unless one is set; then the holder gets it.
  CHECK(r->weight_cache.layout_max_bytes == 0);
  CHECK(std::find(h->begin(), h->end(), "--layout-max-bytes") == h->end());
  auto capped = ParseConfig(kBase, "/srv/c.toml", {"weight_cache.layout=engine", "weight_cache.layout_max_bytes=1048576"});
  REQUIRE(capped.ok());
  CHECK(capped->weight_cache.layout_max_bytes == 1048576);
  auto hcap = HolderArgv(*capped, 0, "/opt/wsup/bin/wsup-holder");
  REQUIRE(hcap.ok());
  auto cap = std::find(hcap->begin(), hcap->end(), "--layout-max-bytes");
  REQUIRE(cap != hcap->end());
  CHECK(*(cap + 1) == "1048576");
  CHECK(DescribeConfig(*capped).find("layouts at most 1048576 bytes") != std::string::npos);
  // A holder.command of its own takes it as {layout_max_bytes}.
  auto custom = ParseConfig(kBase, "/srv/c.toml",
                            {"weight_cache.layout=engine", "weight_cache.layout_max_bytes=8192",
                             "holder.command=[\"/bin/h\", \"--cap\", \"{layout_max_bytes}\"]"});
  INFO((custom.ok() ? "" : custom.error().message()));
  REQUIRE(custom.ok());
  auto hcustom = HolderArgv(*custom, 0, "x");
  REQUIRE(hcustom.ok());
  CHECK(hcustom->back() == "8192");
  // The checkpoint layout's holder still loads the checkpoint.
  auto hc = HolderArgv(*def, 0, "/opt/wsup/bin/wsup-holder");
  REQUIRE(hc.ok());
  CHECK(std::find(hc->begin(), hc->end(), "--model") != hc->end());
  CHECK(std::find(h->begin(), h->end(), "--device") == h->end());  // host: no device
  // On cuda the holder keeps its layouts on the rank's GPU.
  auto gpu = ParseConfig(kBase, "/srv/c.toml",
                         {"weight_cache.layout=engine", "weight_cache.backend=cuda", "parallel.devices=[3]"});
  INFO((gpu.ok() ? "" : gpu.error().message()));
  REQUIRE(gpu.ok());
  auto hg = HolderArgv(*gpu, 0, "/opt/wsup/bin/wsup-holder");
  REQUIRE(hg.ok());
  auto backend = std::find(hg->begin(), hg->end(), "--backend");
  REQUIRE(backend != hg->end());
  CHECK(*(backend + 1) == "cuda");
  auto device = std::find(hg->begin(), hg->end(), "--device");
  REQUIRE(device != hg->end());
  CHECK(*(device + 1) == "3");
  CHECK(std::find(hg->begin(), hg->end(), "engine") != hg->end());

  struct Case {
    std::vector<std::string> sets;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {{"weight_cache.layout=fused"}, "weight_cache.layout"},
           {{"weight_cache.layout=engine", "weight_cache.mode=off"}, "needs a holder to publish to"},
           {{"weight_cache.layout_max_bytes=4096"}, "set weight_cache.layout = \"engine\""},
           {{"weight_cache.layout=engine", "weight_cache.layout_max_bytes=-1"}, "is out of range"},
           {{"weight_cache.layout=engine", "weight_cache.layout_max_bytes=1125899906842625"}, "is out of range"},
           {{"weight_cache.layout=engine", "weight_cache.layout_max_bytes=\"1G\""}, "an integer from 0 to"},
       }) {
    auto bad = ParseConfig(kBase, "c.toml", c.sets);
    REQUIRE_FALSE(bad.ok());
    INFO(bad.error().message());
    CHECK(bad.error().message().find(c.says) != std::string::npos);
    CHECK(bad.error().message().find("weight_cache.layout") != std::string::npos);
  }
}

TEST_CASE("config: port probe needs no answer, and refuses one", "[config]") {
  std::string text = Edit("prompt = \"Hello\"\nexpect = \"world\"\n", "kind = \"port\"\n");
  auto r = ParseConfig(text, "c.toml");
  INFO((r.ok() ? "" : r.error().message()));
  REQUIRE(r.ok());
  CHECK(r->probe.kind == ProbeKind::kPort);
  r = ParseConfig(text, "c.toml", {"probe.prompt=hi"});
  REQUIRE_FALSE(r.ok());
  CHECK(Split(r.error().message()).key == "probe.prompt");
}

TEST_CASE("config: listen addresses", "[config]") {
  auto a = ParseListenAddress("[::1]:8080");
  REQUIRE(a.ok());
  CHECK(a->host == "::1");
  CHECK(a->port == 8080);
  CHECK(a->ToString() == "[::1]:8080");
  a = ParseListenAddress("0.0.0.0:0");
  REQUIRE(a.ok());
  CHECK(a->port == 0);
  a = ParseListenAddress("localhost:65535");
  REQUIRE(a.ok());
  CHECK(a->ToString() == "localhost:65535");
  for (const char* bad : {"", ":80", "1.2.3.4:", "1.2.3.4:-1", "1.2.3.4:65536", "[::1", "[]:80", "a b:80",
                          "1.2.3:80", "-host:80", "[1.2.3.4]:80", "1.2.3.4:123456"}) {
    INFO(bad);
    CHECK_FALSE(ParseListenAddress(bad).ok());
  }
}

TEST_CASE("config: the kv section sizes the KV pool per rank - holders make it, placeholders carry both sizes",
          "[config]") {
  auto def = ParseConfig(kBase, "/srv/c.toml");
  REQUIRE(def.ok());
  CHECK(def->kv.pool_mib == 0);
  CHECK(def->kv.scratch_mib == 64);
  // No pool: no flag (holders of other versions know none), no line.
  auto h0 = HolderArgv(*def, 0, "/opt/wsup/bin/wsup-holder");
  REQUIRE(h0.ok());
  CHECK(std::find(h0->begin(), h0->end(), "--kv-pool-mib") == h0->end());
  CHECK(DescribeConfig(*def).find("kv:") == std::string::npos);

  const std::string text = std::string(kBase) + "\n[kv]\npool_mib = 8\nscratch_mib = 16\n";
  auto r = ParseConfig(text, "/srv/c.toml",
                       {"engine.command=[\"e\", \"--port\", \"{port}\", \"--kv-pool-mib\", \"{kv_pool_mib}\", "
                        "\"--kv-scratch-mib={kv_scratch_mib}\"]"});
  INFO((r.ok() ? "" : r.error().message()));
  REQUIRE(r.ok());
  CHECK(r->kv.pool_mib == 8);
  CHECK(r->kv.scratch_mib == 16);
  auto e = EngineArgv(*r, 8001);
  REQUIRE(e.ok());
  CHECK(*e == std::vector<std::string>{"e", "--port", "8001", "--kv-pool-mib", "8", "--kv-scratch-mib=16"});
  CHECK(DescribeConfig(*r).find("kv: a pool of 8 MiB per rank") != std::string::npos);
  CHECK(DescribeConfig(*r).find("scratch 16 MiB") != std::string::npos);

  // The standard holder arguments, both layouts, get the pool.
  for (const char* layout : {"checkpoint", "engine"}) {
    INFO(layout);
    auto c = ParseConfig(text, "/srv/c.toml", {std::string("weight_cache.layout=") + layout});
    REQUIRE(c.ok());
    auto h = HolderArgv(*c, 0, "/opt/wsup/bin/wsup-holder");
    REQUIRE(h.ok());
    auto pool = std::find(h->begin(), h->end(), "--kv-pool-mib");
    REQUIRE(pool != h->end());
    REQUIRE(pool + 1 != h->end());
    CHECK(*(pool + 1) == "8");
  }
  // A holder.command of its own passes them itself.
  auto custom = ParseConfig(text, "/srv/c.toml",
                            {"holder.command=[\"/bin/h\", \"--pool\", \"{kv_pool_mib}\", \"{kv_scratch_mib}\"]"});
  INFO((custom.ok() ? "" : custom.error().message()));
  REQUIRE(custom.ok());
  auto hc = HolderArgv(*custom, 0, "x");
  REQUIRE(hc.ok());
  CHECK(*hc == std::vector<std::string>{"/bin/h", "--pool", "8", "16"});
  for (const auto* names : {&EnginePlaceholders(), &HolderPlaceholders()}) {
    CHECK(std::find(names->begin(), names->end(), "kv_pool_mib") != names->end());
    CHECK(std::find(names->begin(), names->end(), "kv_scratch_mib") != names->end());
  }
  // A pool in client or off mode is refused, none is fine.
  CHECK(ParseConfig(kBase, "c.toml", {"weight_cache.mode=client", "kv.scratch_mib=8"}).ok());
  CHECK_FALSE(ParseConfig(text, "c.toml", {"weight_cache.mode=off"}).ok());
}

TEST_CASE("config: placeholders expand, unknown ones are refused", "[config]") {
  auto r = ExpandPlaceholders({"--port={port}", "{\"json\":1}", "{port}{port}", "{}"}, {{"port", "7"}});
  REQUIRE(r.ok());
  CHECK(*r == std::vector<std::string>{"--port=7", "{\"json\":1}", "77", "{}"});
  auto bad = ExpandPlaceholders({"{nope}"}, {{"port", "7"}});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message().find("{nope}") != std::string::npos);
  CHECK(bad.error().message().find("{port}") != std::string::npos);
}

TEST_CASE("config: check returns 0 with a summary or 1 with the error", "[config]") {
  test::TempDir dir;
  std::string good = dir.Join("good.toml");
  REQUIRE(WriteFileAtomic(good, kBase).ok());
  auto ok = CheckConfig(good);
  CHECK(ok.exit_code == 0);
  CHECK(ok.output.find("ok") != std::string::npos);
  CHECK(ok.output.back() == '\n');
  auto bad = CheckConfig(good, {"probe.failures=0"});
  CHECK(bad.exit_code == 1);
  CHECK(bad.output.rfind("--set:1:16: probe.failures: ", 0) == 0);
  CHECK(bad.output.back() == '\n');
}

// kBase as member `index` of a group of `size`, with `extra` lines in [group].
std::string Member(int index, int size, const std::string& extra = "") {
  return std::string(kBase) + "\n[group]\nname = \"g\"\nindex = " + std::to_string(index) + "\nsize = " +
         std::to_string(size) + "\netcd = [\"http://127.0.0.1:2379\", \"http://127.0.0.1:2380\"]\n" + extra;
}

TEST_CASE("config: the group table is read and described - bad keys are refused naming them", "[config]") {
  auto c = ParseConfig(Member(1, 3, "head = 2\nlease_ttl_ms = 5000\n"), "/x/n.toml");
  REQUIRE(c.ok());
  CHECK(c->group.enabled());
  CHECK(c->group.name == "g");
  CHECK(c->group.index == 1);
  CHECK(c->group.size == 3);
  CHECK(c->group.head == 2);
  CHECK(c->group.lease_ttl_ms == 5000);
  CHECK(c->group.etcd == std::vector<std::string>{"http://127.0.0.1:2379", "http://127.0.0.1:2380"});
  CHECK(DescribeConfig(*c).find("group g: member 1 of 3 (head 2), tp 3 in all") != std::string::npos);
  auto alone = ParseConfig(kBase, "/x/n.toml");
  REQUIRE(alone.ok());
  CHECK_FALSE(alone->group.enabled());

  struct Bad {
    std::string text, key, needle;
  };
  const std::string base = std::string(kBase) + "\n[group]\n";
  const std::vector<Bad> bad = {
      {Member(3, 3), "group.index", "3 is not a member; allowed: 0 to 2"},
      {Member(0, 2, "head = 2\n"), "group.head", "2 is not a member"},
      {Member(0, 1), "group.size", "1 is out of range; allowed: an integer from 2 to 256"},
      {Member(0, 2, "lease_ttl_ms = 1500\n"), "group.lease_ttl_ms", "not whole seconds"},
      {Member(0, 2, "lease_ttl_ms = 500\n"), "group.lease_ttl_ms", "out of range"},
      {base + "name = \"g\"\nindex = 0\nsize = 2\n", "group.etcd", "missing; this key is required in [group]"},
      {base + "name = \"g\"\nindex = 0\nsize = 2\netcd = []\n", "group.etcd", "is empty; the members agree through etcd"},
      {base + "name = \"g\"\nindex = 0\nsize = 2\netcd = [\"127.0.0.1:2379\"]\n", "group.etcd",
       "is not an etcd endpoint: not an http:// URL; write http://HOST:PORT"},
      {base + "name = \"g\"\nindex = 0\nsize = 2\netcd = [\"http://10.0.0.1:2379/v3\"]\n", "group.etcd",
       "the port is not a number"},
      {base + "name = \"g\"\nindex = 0\nsize = 2\netcd = [\"https://10.0.0.1:2379\"]\n", "group.etcd",
       "https is not supported"},
      {base + "name = \"g\"\nindex = 0\nsize = 2\netcd = [\"http://etcd.example:2379\"]\n", "group.etcd",
       "names are not resolved"},
      {base + "name = \"g\"\nindex = 0\nsize = 2\netcd = [\"http://10.0.0.1:2379\", \"http://10.0.0.1:2379\"]\n", "group.etcd",
       "is listed twice"},
      {base + "index = 0\nsize = 2\netcd = [\"http://10.0.0.1:2379\"]\n", "group.name", "missing"},
      {base + "name = \"a b\"\nindex = 0\nsize = 2\netcd = [\"http://10.0.0.1:2379\"]\n", "group.name", "plain name"},
      {base + "name = \"g\"\nsize = 2\netcd = [\"http://10.0.0.1:2379\"]\n", "group.index", "missing"},
      {Member(0, 2, "members = 3\n"), "group.members", "unknown key"},
  };
  for (const auto& b : bad) {
    INFO(b.text);
    auto r = ParseConfig(b.text, "/x/n.toml");
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message());
    const auto e = Split(r.error().message());
    CHECK(e.key == b.key);
    CHECK(e.what.find(b.needle) != std::string::npos);
  }
}

TEST_CASE("config: a group's configs are checked together - a missing member, a duplicate index, shares that "
          "differ are named",
          "[config]") {
  test::TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir.Join(name);
    REQUIRE(WriteFileAtomic(path, text).ok());
    return path;
  };
  const std::string a = write("a.toml", Member(0, 2)), b = write("b.toml", Member(1, 2));
  auto whole = CheckConfigs({a, b});
  INFO(whole.output);
  CHECK(whole.exit_code == 0);
  CHECK(whole.output.find("group g: 2 members, whole") != std::string::npos);
  auto one = CheckConfigs({a});
  CHECK(one.exit_code == 0);
  CHECK(one.output.find("one member's config given") != std::string::npos);

  struct Bad {
    std::vector<std::string> files;
    std::string file, key, needle;
  };
  const std::string c3 = write("c.toml", Member(1, 3));
  const std::string dup = write("dup.toml", Member(0, 2));
  const std::string tp2 = write("tp2.toml", Member(1, 2) + "\n[parallel]\ntp = 2\n");
  const std::string other_etcd = write("etcd.toml", std::string(kBase) +
                                                        "\n[group]\nname = \"g\"\nindex = 1\nsize = 2\netcd = "
                                                        "[\"http://127.0.0.1:2479\"]\n");
  const std::string renamed = write("renamed.toml", std::string(kBase) +
                                                        "\n[group]\nname = \"h\"\nindex = 1\nsize = 2\netcd = "
                                                        "[\"http://127.0.0.1:2380\", \"http://127.0.0.1:2379\"]\n");
  const std::string lone = write("lone.toml", kBase);
  const std::vector<Bad> bad = {
      {{a, dup}, dup, "group.index", "0 is also " + a + "'s"},
      {{a, dup}, a, "group.size", "no config given is member 1"},
      {{a, c3}, c3, "group.size", "3 differs from " + a + "'s 2"},
      {{a, tp2}, tp2, "parallel.tp", "2 ranks here, 1 in " + a},
      {{a, other_etcd}, other_etcd, "group.etcd", "every member talks to the same etcd cluster"},
      {{a, renamed}, renamed, "group.name", "\"h\" differs"},
      {{a, lone}, lone, "group", "has no [group]"},
  };
  for (const auto& x : bad) {
    auto out = CheckConfigs(x.files);
    INFO(out.output);
    CHECK(out.exit_code == 1);
    bool found = false;
    std::istringstream lines(out.output);
    for (std::string line; std::getline(lines, line);) {
      const auto e = Split(line);
      if (e.file == x.file && e.key == x.key && e.what.find(x.needle) != std::string::npos) found = true;
    }
    CHECK(found);
  }
  // The etcd endpoints are a set: the same ones in another order agree.
  const std::string swapped = write("swapped.toml", std::string(kBase) +
                                                        "\n[group]\nname = \"g\"\nindex = 1\nsize = 2\netcd = "
                                                        "[\"http://127.0.0.1:2380\", \"http://127.0.0.1:2379\"]\n");
  CHECK(CheckConfigs({a, swapped}).exit_code == 0);
}

// A folder laid out for path checks: a model folder, an executable engine,
// and a holder program.
struct PathsDir {
  test::TempDir dir;
  std::string eng, holder;
  PathsDir() {
    REQUIRE(MakeDirs(dir.Join("model"), 0755).ok());
    REQUIRE(WriteFileAtomic(dir.Join("model/config.json"), "{}").ok());
    REQUIRE(WriteFileAtomic(dir.Join("model/model.safetensors"), "x").ok());
    eng = dir.Join("eng");
    holder = dir.Join("wsup-holder");
    for (const auto& p : {eng, holder}) {
      REQUIRE(WriteFileAtomic(p, "#!/bin/sh\n").ok());
      REQUIRE(::chmod(p.c_str(), 0755) == 0);
    }
  }
  std::string Config(const std::string& text) {
    std::string path = dir.Join("node.toml");
    REQUIRE(WriteFileAtomic(path, text).ok());
    return path;
  }
};

std::string WithEngine(const std::string& program) {
  return Edit("command = [\"eng\", \"--port\", \"{port}\"]", "command = [\"" + program + "\", \"--port\", \"{port}\"]");
}

TEST_CASE("config: check finds what the config names on this machine, located, one line each", "[config]") {
  PathsDir d;
  SECTION("everything in place") {
    auto ok = CheckConfig(d.Config(WithEngine(d.eng)), {}, true, d.holder);
    INFO(ok.output);
    CHECK(ok.exit_code == 0);
  }
  SECTION("a missing model folder") {
    std::string path = d.Config(WithEngine(d.eng));
    auto r = CheckConfig(path, {"model.path=\"nowhere\""}, true, d.holder);
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.rfind("--set:1:12: model.path: ", 0) == 0);
    CHECK(r.output.find("does not exist") != std::string::npos);
    CHECK(r.output.find("checkpoint folder") != std::string::npos);
  }
  SECTION("a model folder without config.json or weights") {
    REQUIRE(MakeDirs(d.dir.Join("empty"), 0755).ok());
    std::string path = d.Config(WithEngine(d.eng));
    auto r = CheckConfig(path, {"model.path=\"empty\""}, true, d.holder);
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("model.path: " + d.dir.Join("empty") + " has no config.json") != std::string::npos);
    CHECK(r.output.find("has no *.safetensors") != std::string::npos);
    // Two problems, two lines.
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 2);
  }
  SECTION("a missing or non-executable engine program, located at its key in the file") {
    std::string path = d.Config(WithEngine(d.dir.Join("missing-engine")));
    auto r = CheckConfig(path, {}, true, d.holder);
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.rfind(path + ":10:11: engine.command: the engine program " + d.dir.Join("missing-engine") +
                             " does not exist",
                         0) == 0);
    REQUIRE(::chmod(d.eng.c_str(), 0644) == 0);
    auto nx = CheckConfig(d.Config(WithEngine(d.eng)), {}, true, d.holder);
    CHECK(nx.exit_code == 1);
    CHECK(nx.output.find("is not executable") != std::string::npos);
    auto bare = CheckConfig(d.Config(WithEngine("no-such-program-anywhere")), {}, true, d.holder);
    CHECK(bare.exit_code == 1);
    CHECK(bare.output.find("not found in PATH") != std::string::npos);
  }
  SECTION("the holder program in daemon mode, and folders that cannot be made") {
    std::string path = d.Config(WithEngine(d.eng));
    auto r = CheckConfig(path, {}, true, d.dir.Join("no-holder"));
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.find("holder.binary: the default holder program") != std::string::npos);
    REQUIRE(WriteFileAtomic(d.dir.Join("afile"), "x").ok());
    auto f = CheckConfig(path, {"node.state_dir=\"afile/state\""}, true, d.holder);
    CHECK(f.exit_code == 1);
    CHECK(f.output.find("node.state_dir: ") != std::string::npos);
    CHECK(f.output.find("is not a folder") != std::string::npos);
  }
  SECTION("--no-paths accepts a config written for another machine") {
    std::string path = d.Config(WithEngine("/opt/elsewhere/engine"));
    auto r = CheckConfig(path, {"model.path=\"/models/elsewhere\""}, false, d.holder);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("--no-paths") != std::string::npos);
  }
}

}  // namespace
}  // namespace wsup

namespace wsup {
namespace {

TEST_CASE("config: parallel.expert_parallel starts holders with --ep-size and gives engines {ep}",
          "[config]") {
  auto plain = ParseConfig(kBase, "/srv/c.toml", {"parallel.tp=2"});
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->parallel.expert_parallel);
  CHECK(plain->parallel.ep() == 1);
  auto hp = HolderArgv(*plain, 1, "/opt/wsup/bin/wsup-holder");
  REQUIRE(hp.ok());
  CHECK(std::find(hp->begin(), hp->end(), "--ep-size") == hp->end());

  auto r = ParseConfig(kBase, "/srv/c.toml",
                       {"parallel.tp=2", "parallel.expert_parallel=true",
                        "engine.command=[\"e\", \"--port\", \"{port}\", \"--ep\", \"{ep}\"]"});
  INFO((r.ok() ? "" : r.error().message()));
  REQUIRE(r.ok());
  CHECK(r->parallel.expert_parallel);
  CHECK(r->parallel.ep() == 2);
  auto h = HolderArgv(*r, 1, "/opt/wsup/bin/wsup-holder");
  REQUIRE(h.ok());
  auto ep = std::find(h->begin(), h->end(), "--ep-size");
  REQUIRE(ep != h->end());
  REQUIRE(ep + 3 < h->end());
  CHECK(*(ep + 1) == "2");
  CHECK(*(ep + 2) == "--ep-rank");
  CHECK(*(ep + 3) == "1");
  auto e = EngineArgv(*r, 8001);
  REQUIRE(e.ok());
  CHECK(e->back() == "2");
  CHECK(DescribeConfig(*r).find("experts: ep 2") != std::string::npos);

  auto bad = ParseConfig(kBase, "c.toml", {"parallel.expert_parallel=2"});
  REQUIRE_FALSE(bad.ok());
  INFO(bad.error().message());
  CHECK(bad.error().message().find("parallel.expert_parallel") != std::string::npos);
  CHECK(bad.error().message().find("boolean") != std::string::npos);
}

TEST_CASE("config: check refuses expert_parallel for a model without experts or experts tp does not divide",
          "[config]") {
  if (!test::HaveTestData("qwen3moe-tiny-f32") || !test::HaveTestData("llama-tiny-f32")) return;
  PathsDir d;
  std::string path = d.Config(WithEngine(d.eng));
  const std::string moe = "model.path=\"" + test::TestData("qwen3moe-tiny-f32") + "\"";
  auto ok = CheckConfig(path, {moe, "parallel.tp=2", "parallel.expert_parallel=true"}, true, d.holder);
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  auto three = CheckConfig(path, {moe, "parallel.tp=3", "parallel.expert_parallel=true"}, true, d.holder);
  INFO(three.output);
  CHECK(three.exit_code == 1);
  CHECK(three.output.find("parallel.expert_parallel: is true, but the 8 experts of") != std::string::npos);
  CHECK(three.output.find("do not divide among parallel.tp = 3 ranks") != std::string::npos);
  // Without expert parallelism the same tp is the tp check's: it cuts the
  // vocabulary and the heads either way.
  auto plain = CheckConfig(path, {moe, "parallel.tp=3"}, true, d.holder);
  INFO(plain.output);
  CHECK(plain.exit_code == 1);
  CHECK(plain.output.find("parallel.expert_parallel") == std::string::npos);
  CHECK(plain.output.find("parallel.tp: 3 cannot split the model") != std::string::npos);
  auto dense = CheckConfig(path,
                           {"model.path=\"" + test::TestData("llama-tiny-f32") + "\"", "parallel.tp=2",
                            "parallel.expert_parallel=true"},
                           true, d.holder);
  INFO(dense.output);
  CHECK(dense.exit_code == 1);
  CHECK(dense.output.find("has no routed experts to partition") != std::string::npos);
}

}  // namespace
}  // namespace wsup

namespace wsup {
namespace {

TEST_CASE("config: socket paths at the limit pass, and a holder socket counts only where holders run",
          "[config]") {
  // /<94 bytes>/holder.sock is 107 bytes: exactly what sun_path holds.
  CHECK(ParseConfig(kBase, "/etc/wsup/c.toml", {"node.runtime_dir=/" + std::string(94, 'r')}).ok());
  CHECK_FALSE(ParseConfig(kBase, "/etc/wsup/c.toml", {"node.runtime_dir=/" + std::string(95, 'r')}).ok());
  // No holders: front.sock is the longest, 11 bytes.
  CHECK(ParseConfig(kBase, "/etc/wsup/c.toml", {"node.runtime_dir=/" + std::string(95, 'r'), "weight_cache.mode=off"})
            .ok());
  // Sockets of their own leave runtime_dir only front.sock to hold.
  CHECK(ParseConfig(kBase, "/etc/wsup/c.toml",
                    {"node.runtime_dir=/" + std::string(95, 'r'), "weight_cache.socket=/run/h.sock"})
            .ok());
}

// Every line of a failed check is one located error.
std::vector<ErrorForm> Lines(const CheckOutcome& r) {
  std::vector<ErrorForm> out;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) out.push_back(Split(line));
  return out;
}

TEST_CASE("config: check refuses what the model cannot do: a tp that cuts it, probe ids outside its vocabulary, "
          "a probe longer than its context",
          "[config]") {
  if (!test::HaveTestData("llama-tiny-f32")) return;
  PathsDir d;
  const std::string model = "model.path=\"" + test::TestData("llama-tiny-f32") + "\"";
  std::string path = d.Config(WithEngine(d.eng));
  auto ok = CheckConfig(path, {model, "parallel.tp=2"}, true, d.holder);
  INFO(ok.output);
  CHECK(ok.exit_code == 0);

  // 4 heads, 2 KV heads, a vocabulary of 256: tp 3 cuts them all.
  auto tp = CheckConfig(path, {model, "parallel.tp=3"}, true, d.holder);
  INFO(tp.output);
  CHECK(tp.exit_code == 1);
  auto lines = Lines(tp);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].file == "--set");
  CHECK(lines[0].line == 2);
  CHECK(lines[0].key == "parallel.tp");
  CHECK(lines[0].what.rfind("3 cannot split the model: " + test::TestData("llama-tiny-f32"), 0) == 0);
  CHECK(lines[0].what.find("tp sizes this checkpoint can use: 1, 2, 4") != std::string::npos);

  // A group member's ranks are a share: 3 members of 1 rank cut the model,
  // 2 members of 2 ranks split it in 4.
  const std::vector<std::string> group = {model, "group.name=g", "group.index=0",
                                          "group.etcd=[\"http://127.0.0.1:2379\"]"};
  auto three = group;
  three.push_back("group.size=3");
  auto cut = CheckConfig(path, three, true, d.holder);
  INFO(cut.output);
  CHECK(cut.exit_code == 1);
  lines = Lines(cut);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].key == "parallel.tp");
  CHECK(lines[0].what.rfind("parallel.tp x group.size = 3 cannot split the model", 0) == 0);
  auto four = group;
  four.insert(four.end(), {"group.size=2", "parallel.tp=2"});
  auto split = CheckConfig(path, four, true, d.holder);
  INFO(split.output);
  CHECK(split.exit_code == 0);

  // The probe: kBase expects text; these give ids, at the key's line in the file.
  std::string ids_text = WithEngine(d.eng);
  ids_text.replace(ids_text.find("expect = \"world\""), 16, "expect_token_ids = [1, 300, 2]");
  std::string ids_path = d.dir.Join("ids.toml");
  REQUIRE(WriteFileAtomic(ids_path, ids_text).ok());
  auto vocab = CheckConfig(ids_path, {model}, true, d.holder);
  INFO(vocab.output);
  CHECK(vocab.exit_code == 1);
  lines = Lines(vocab);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].line == 16);
  CHECK(lines[0].key == "probe.expect_token_ids");
  CHECK(lines[0].what.find("element 2 (300) of [1, 300, 2] is outside the vocabulary") != std::string::npos);
  CHECK(lines[0].what.find("vocab_size 256") != std::string::npos);

  // One token per byte (the model has no tokenizer); a context of 512.
  auto prompt = CheckConfig(path, {model, "probe.prompt=" + std::string(600, 'p')}, true, d.holder);
  INFO(prompt.output);
  CHECK(prompt.exit_code == 1);
  lines = Lines(prompt);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].key == "probe.prompt");
  CHECK(lines[0].what.find("is 600 tokens") != std::string::npos);
  CHECK(lines[0].what.find("context is 512 tokens") != std::string::npos);
  auto room = CheckConfig(path, {model, "probe.prompt=" + std::string(510, 'p')}, true, d.holder);
  INFO(room.output);
  lines = Lines(room);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].key == "probe.max_tokens");
  CHECK(lines[0].what.find("lower max_tokens to at most 2") != std::string::npos);
  CHECK(CheckConfig(path, {model, "probe.prompt=" + std::string(508, 'p')}, true, d.holder).exit_code == 0);
}

TEST_CASE("config: with a tokenizer of its own a prompt's length is not judged, max_tokens against the context is",
          "[config]") {
  if (!test::HaveTestData("llama-tiny-f32")) return;
  PathsDir d;
  REQUIRE(MakeDirs(d.dir.Join("tok"), 0755).ok());
  auto cfg = ReadFile(test::TestData("llama-tiny-f32") + "/config.json");
  REQUIRE(cfg.ok());
  REQUIRE(WriteFileAtomic(d.dir.Join("tok/config.json"), *cfg).ok());
  REQUIRE(WriteFileAtomic(d.dir.Join("tok/model.safetensors"), "x").ok());
  REQUIRE(WriteFileAtomic(d.dir.Join("tok/tokenizer.json"), "{}").ok());
  std::string path = d.Config(WithEngine(d.eng));
  auto r = CheckConfig(path, {"model.path=\"tok\"", "probe.prompt=" + std::string(600, 'p')}, true, d.holder);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  auto m = CheckConfig(path, {"model.path=\"tok\"", "probe.max_tokens=512"}, true, d.holder);
  INFO(m.output);
  auto lines = Lines(m);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].key == "probe.max_tokens");
  CHECK(lines[0].what.find("512 leaves no room for the prompt") != std::string::npos);
}

TEST_CASE("config: check refuses an unusable state folder, saying how it is unusable", "[config]") {
  PathsDir d;
  std::string path = d.Config(WithEngine(d.eng));
  auto refused = [&](const std::string& state_dir, const std::string& words) {
    auto r = CheckConfig(path, {"node.state_dir=\"" + state_dir + "\""}, true, d.holder);
    INFO(state_dir << ": " << r.output);
    CHECK(r.exit_code == 1);
    auto lines = Lines(r);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].key == "node.state_dir");
    CHECK(lines[0].what.find(words) != std::string::npos);
  };
  REQUIRE(::symlink(d.dir.Join("loop-b").c_str(), d.dir.Join("loop-a").c_str()) == 0);
  REQUIRE(::symlink(d.dir.Join("loop-a").c_str(), d.dir.Join("loop-b").c_str()) == 0);
  refused("loop-a", d.dir.Join("loop-a") + " is a symbolic link loop");
  refused("loop-a/state", d.dir.Join("loop-a") + " is a symbolic link loop");
  REQUIRE(::symlink(d.dir.Join("nowhere").c_str(), d.dir.Join("dangling").c_str()) == 0);
  refused("dangling", d.dir.Join("dangling") + " is a symbolic link to a path that does not exist");
  REQUIRE(WriteFileAtomic(d.dir.Join("afile"), "x").ok());
  refused("afile", d.dir.Join("afile") + " exists and is not a folder");
  REQUIRE(MakeDirs(d.dir.Join("s1/logs"), 0755).ok());
  REQUIRE(::rmdir(d.dir.Join("s1/logs").c_str()) == 0);
  REQUIRE(WriteFileAtomic(d.dir.Join("s1/logs"), "x").ok());
  refused("s1", d.dir.Join("s1/logs") + " exists and is not a folder");
  REQUIRE(MakeDirs(d.dir.Join("s2/wsup.db"), 0755).ok());
  refused("s2", d.dir.Join("s2/wsup.db") + " (the ledger) exists and is not a file");
  if (::geteuid() != 0) {
    REQUIRE(MakeDirs(d.dir.Join("ro"), 0555).ok());
    refused("ro/state", "cannot be created: " + d.dir.Join("ro") + " is not writable by this user");
  }
  CHECK(CheckConfig(path, {"node.state_dir=\"fresh/state\""}, true, d.holder).exit_code == 0);
}

TEST_CASE("config: check refuses a state folder on a read-only filesystem", "[config]") {
  PathsDir d;
  std::string path = d.Config(WithEngine(d.eng));
  REQUIRE(MakeDirs(d.dir.Join("ro"), 0755).ok());
  const std::string out = d.dir.Join("check.out");
  for (const std::string state : {"ro", "ro/state"}) {
    int code = test::RunWithReadOnlyMount(
        d.dir.Join("ro"),
        [&] {
          auto r = CheckConfig(path, {"node.state_dir=\"" + state + "\""}, true, d.holder);
          return WriteFileAtomic(out, r.output).ok() ? r.exit_code : 2;
        },
        std::chrono::seconds(30));
    if (code == test::kNoReadOnlyMount) {
      WARN("SKIP: this machine lets no test mount a read-only filesystem (no mount or user namespaces)");
      return;
    }
    std::string output = test::ReadAll(out);
    INFO(output);
    CHECK(code == 1);
    REQUIRE(!output.empty());
    ErrorForm e = Split(output.substr(0, output.find('\n')));
    CHECK(e.key == "node.state_dir");
    CHECK(e.what.find(d.dir.Join("ro") + " is on a read-only filesystem") != std::string::npos);
  }
}

}  // namespace
}  // namespace wsup
