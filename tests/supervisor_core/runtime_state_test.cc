// What state.json keeps for a restarted supervisor's rollout decisions
// (supervisor/runtime_state.h): each engine's version, the node's, and a
// running rollout, round-tripped; the file readable by its owner only (env
// values may be secrets); a malformed part dropped and said, never the
// processes the file names.
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "supervisor/runtime_state.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using nlohmann::json;

EngineVersion Version(const std::string& flag, const std::string& token) {
  return EngineVersion{{"/bin/engine", "--port", "{port}", flag}, {{"HF_TOKEN", token}, {"NCCL_DEBUG", "WARN"}}};
}

RuntimeState Sample() {
  RuntimeState st;
  st.config_path = "/etc/wsup/n.toml";
  st.node_name = "n";
  st.supervisor = {4242, 17};
  st.engine_version = Version("--v1", "hf_secret_1");
  st.engines.push_back({"a", {101, 7}, 8001, "active", 1000, "hit", "nonce-a", Version("--v2", "hf_secret_2")});
  st.engines.push_back({"b", {102, 8}, 8002, "standby", 1001, "hit", "nonce-b", Version("--v1", "hf_secret_1")});
  RuntimeState::Rollout ro;
  ro.id = 3;
  ro.step = "watching";
  ro.new_slot = "a";
  ro.old_slot = "b";
  ro.started_ms = 1'700'000'000'000;
  ro.from = Version("--v1", "hf_secret_1");
  ro.to = Version("--v2", "hf_secret_2");
  ro.new_proven = true;
  ro.cause = "";
  ro.command_before = "[\"/bin/engine\",\"--v1\"]";
  ro.command_after = "[\"/bin/engine\",\"--v2\"]";
  ro.steps_json = R"([{"step":"stopping_standby","slot":"a","at_ms":1,"why":"wsup reload"}])";
  st.rollout = ro;
  return st;
}

TEST_CASE("runtime state: the versions and a running rollout survive a save and a load, in a file only its owner "
          "reads",
          "[rollout]") {
  test::TempDir dir;
  const std::string path = RuntimeState::PathIn(dir.path());
  // A leftover temporary file made looser does not loosen the state.
  REQUIRE(WriteFileAtomic(path + ".tmp", "old").ok());
  REQUIRE(::chmod((path + ".tmp").c_str(), 0644) == 0);
  const RuntimeState st = Sample();
  REQUIRE(st.Save(path).ok());
  struct stat sb{};
  REQUIRE(::stat(path.c_str(), &sb) == 0);
  CHECK((sb.st_mode & 0777) == 0600);

  auto loaded = RuntimeState::Load(path);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->has_value());
  const RuntimeState& got = **loaded;
  CHECK(got.dropped.empty());
  REQUIRE(got.engine_version);
  CHECK(*got.engine_version == *st.engine_version);
  REQUIRE(got.engines.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(got.engines[i].version);
    CHECK(*got.engines[i].version == *st.engines[i].version);
  }
  REQUIRE(got.rollout);
  CHECK(got.rollout->id == 3);
  CHECK(got.rollout->step == "watching");
  CHECK(got.rollout->new_slot == "a");
  CHECK(got.rollout->old_slot == "b");
  CHECK(got.rollout->started_ms == st.rollout->started_ms);
  CHECK(got.rollout->from == st.rollout->from);
  CHECK(got.rollout->to == st.rollout->to);
  CHECK(got.rollout->new_proven);
  CHECK_FALSE(got.rollout->rolling_back);
  CHECK(got.rollout->command_before == st.rollout->command_before);
  CHECK(got.rollout->steps_json == st.rollout->steps_json);
  // Versions differ by their env values alone, too.
  EngineVersion other = *st.engine_version;
  other.env[0].second = "hf_other";
  CHECK_FALSE(other == *st.engine_version);
}

TEST_CASE("runtime state: a malformed version or rollout is dropped and said, the processes are kept, an older file "
          "has none",
          "[rollout]") {
  test::TempDir dir;
  const std::string path = RuntimeState::PathIn(dir.path());
  json j = json::parse(Sample().ToJson());
  j["engines"][0]["version"]["env"] = "not an object";
  j["rollout"]["id"] = "seven";
  REQUIRE(WriteFileAtomic(path, j.dump()).ok());
  auto loaded = RuntimeState::Load(path);
  INFO((loaded.ok() ? "" : loaded.error().message()));
  REQUIRE(loaded.ok());
  const RuntimeState& got = **loaded;
  CHECK(got.engines.size() == 2);
  CHECK_FALSE(got.engines[0].version.has_value());
  CHECK(got.engines[1].version.has_value());
  CHECK_FALSE(got.rollout.has_value());
  CHECK(got.dropped.find("engine a's version") != std::string::npos);
  CHECK(got.dropped.find("the rollout in progress") != std::string::npos);

  // Written by a wsup before versions were kept: read as before.
  j = json::parse(Sample().ToJson());
  j.erase("engine_version");
  j.erase("rollout");
  for (auto& e : j["engines"]) e.erase("version");
  REQUIRE(WriteFileAtomic(path, j.dump()).ok());
  loaded = RuntimeState::Load(path);
  REQUIRE(loaded.ok());
  CHECK((*loaded)->engines.size() == 2);
  CHECK_FALSE((*loaded)->engine_version.has_value());
  CHECK_FALSE((*loaded)->engines[0].version.has_value());
  CHECK_FALSE((*loaded)->rollout.has_value());
  CHECK((*loaded)->dropped.empty());
}

TEST_CASE("runtime state: a field of the wrong type is an error naming the field, never an exception", "[state]") {
  test::TempDir dir;
  const std::string path = RuntimeState::PathIn(dir.path());
  struct Damage {
    const char* what;
    std::function<void(json&)> apply;
    const char* named;
  };
  const std::vector<Damage> damages = {
      {"pid a string", [](json& j) { j["supervisor"]["pid"] = "x"; }, "pid"},
      {"no supervisor", [](json& j) { j.erase("supervisor"); }, "supervisor"},
      {"front an array", [](json& j) { j["front"] = json::array(); }, "front"},
      {"holders an object", [](json& j) { j["holders"] = json::object(); }, "holders"},
      {"engine port a fraction", [](json& j) { j["engines"][1]["port"] = 80.5; }, "engines[1]"},
      {"engine role null", [](json& j) { j["engines"][0]["role"] = nullptr; }, "role"},
      {"epoch a string", [](json& j) { j["epoch"] = "7"; }, "epoch"},
      {"version a string", [](json& j) { j["version"] = "1"; }, "version"},
      {"not an object", [](json& j) { j = json::array({1, 2}); }, "not an object"},
  };
  for (const Damage& d : damages) {
    INFO(d.what);
    json j = json::parse(Sample().ToJson());
    d.apply(j);
    REQUIRE(WriteFileAtomic(path, j.dump()).ok());
    auto loaded = RuntimeState::Load(path);
    REQUIRE_FALSE(loaded.ok());
    INFO(loaded.error().message());
    CHECK(loaded.error().code() == Code::kCorrupt);
    CHECK(loaded.error().message().find(d.named) != std::string::npos);
    CHECK(loaded.error().message().find("remove the file") != std::string::npos);
  }
  REQUIRE(WriteFileAtomic(path, "{\"version\": ").ok());
  auto cut = RuntimeState::Load(path);
  REQUIRE_FALSE(cut.ok());
  CHECK(cut.error().message().find("not valid JSON") != std::string::npos);
}

TEST_CASE("runtime state: a rollout's cause cut inside a character is saved and read back, not thrown", "[state]") {
  test::TempDir dir;
  const std::string path = RuntimeState::PathIn(dir.path());
  RuntimeState st = Sample();
  // An engine's error text cut at a byte count, in the middle of "é".
  st.rollout->cause = std::string("HTTP 500: caf\xc3");
  REQUIRE(st.Save(path).ok());
  auto loaded = RuntimeState::Load(path);
  INFO((loaded.ok() ? "" : loaded.error().message()));
  REQUIRE(loaded.ok());
  REQUIRE((*loaded)->rollout.has_value());
  CHECK((*loaded)->rollout->cause.rfind("HTTP 500: caf", 0) == 0);
}

}  // namespace
}  // namespace wsup
