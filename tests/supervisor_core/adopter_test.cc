// Adopter (supervisor/adopter.h) on its own: the engines, the pool, the
// front and the ledger behind its hooks, and the front's answer held by the
// test. Each test checks what was done, in which order, and what was
// recorded.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "supervisor/adopter.h"

namespace wsup {
namespace {

using nlohmann::json;

constexpr int64_t kNow = 50'000;
constexpr int64_t kSaved = 40'000;

RuntimeState::Engine Recorded(const std::string& slot, pid_t pid, int port, const std::string& role) {
  RuntimeState::Engine e;
  e.slot = slot;
  e.proc = ProcessRef{pid, 1};
  e.port = port;
  e.role = role;
  return e;
}

struct AdopterRig {
  FakeClock clock{kNow};
  std::map<std::string, Adopter::Fate> fate;  // by slot; gone when unset
  std::string active;
  std::vector<std::string> did;  // in order
  std::map<std::string, std::pair<int64_t, std::optional<int64_t>>> dated;  // slot: fault, failover id
  std::vector<FailoverRecord> rows;
  std::vector<std::function<void(const json*)>> asks;  // the front's answers, held
  bool adopting = false;
  Adopter adopter{clock, MakeHooks()};

  Adopter::Hooks MakeHooks() {
    Adopter::Hooks h;
    h.kv_held = [this](const std::string& owner) { did.push_back("kv held " + owner); };
    h.adopt = [this](const RuntimeState::Engine& pe) {
      CHECK(adopting);
      did.push_back("adopt " + pe.slot);
      auto it = fate.find(pe.slot);
      return it == fate.end() ? Adopter::Fate::kGone : it->second;
    };
    h.keep_active = [this](const std::string& slot) {
      did.push_back("keep active " + slot);
      active = slot;
    };
    h.proven = [this] { did.push_back("proven"); };
    h.adopting = [this](bool a) { adopting = a; };
    h.kv_owner = [this](const RuntimeState&) { did.push_back("kv owner"); };
    h.settle = [this] {
      CHECK_FALSE(adopting);
      did.push_back("settle");
    };
    h.has_slot = [](const std::string& slot) { return slot == "a" || slot == "b"; };
    h.date = [this](const std::string& slot, const std::string& cause, int64_t fault_ms, std::optional<int64_t> id) {
      CHECK(cause == "crash");
      dated[slot] = {fault_ms, id};
    };
    h.ask_front = [this](std::function<void(const json*)> done) { asks.push_back(std::move(done)); };
    h.slots = [] {
      return std::vector<std::pair<std::string, std::string>>{{"a", "127.0.0.1:9001"}, {"b", "127.0.0.1:9002"}};
    };
    h.active = [this] { return active; };
    h.address = [](int port) { return "127.0.0.1:" + std::to_string(port); };
    h.record = [this](const FailoverRecord& rec) -> std::optional<int64_t> {
      rows.push_back(rec);
      return static_cast<int64_t>(rows.size());
    };
    h.resume_rollout = [this](const RuntimeState::Rollout& r) { did.push_back("resume rollout " + r.step); };
    return h;
  }
};

TEST_CASE("adopter: the pool's owner first, the active engine before the standby, the roles settled after, and a "
          "rollout ended last",
          "[supervisor][adopter]") {
  AdopterRig r;
  RuntimeState prev;
  prev.saved_ms = kSaved;
  prev.kv_pool_owner = "b";
  prev.engines = {Recorded("a", 100, 9001, "standby"), Recorded("b", 200, 9002, "active")};
  prev.rollout = RuntimeState::Rollout{};
  prev.rollout->step = "new_proving";
  r.fate = {{"a", Adopter::Fate::kAdopted}, {"b", Adopter::Fate::kAdopted}};
  r.adopter.Adopt(prev);
  CHECK(r.did == std::vector<std::string>{"kv held b", "adopt b", "keep active b", "proven", "adopt a", "proven",
                                          "kv owner", "settle", "resume rollout new_proving"});
  CHECK(r.asks.empty());  // nothing died: the front is not asked
  CHECK(r.rows.empty());
}

TEST_CASE("adopter: an active engine that died while no supervisor ran is dated by the front's log and gets a "
          "reconstructed failover row, and a replaced one gets none",
          "[supervisor][adopter]") {
  AdopterRig r;
  RuntimeState prev;
  prev.saved_ms = kSaved;
  prev.engines = {Recorded("a", 100, 9001, "active"), Recorded("b", 200, 9002, "standby")};
  r.fate = {{"b", Adopter::Fate::kAdopted}};
  r.adopter.Adopt(prev);
  // Until the front answers, the dead slot is dated from the last save.
  REQUIRE(r.dated.count("a") == 1);
  CHECK(r.dated["a"].first == kSaved);
  CHECK_FALSE(r.dated["a"].second);
  REQUIRE(r.asks.size() == 1);
  r.active = "b";  // promoted meanwhile
  json status = {{"events", json::array({{{"kind", "switched"},
                                          {"from", "127.0.0.1:9001"},
                                          {"to", "127.0.0.1:9002"},
                                          {"reason", "connect refused"},
                                          {"at_ms", 45'000}}})}};
  r.asks[0](&status);
  REQUIRE(r.rows.size() == 1);
  CHECK(r.rows[0].reconstructed);
  CHECK(r.rows[0].from_slot == "a");
  CHECK(r.rows[0].to_slot == "b");
  CHECK(r.rows[0].fault_ms == 45'000);
  CHECK(r.dated["a"].first == 45'000);
  CHECK(r.dated["a"].second == std::optional<int64_t>(1));

  SECTION("a replaced engine is neither dead nor reconstructed") {
    AdopterRig q;
    q.fate = {{"a", Adopter::Fate::kReplaced}, {"b", Adopter::Fate::kAdopted}};
    q.adopter.Adopt(prev);
    CHECK(q.asks.empty());
    CHECK(q.dated.empty());
  }
}

TEST_CASE("adopter: a front that does not answer, or answers what cannot be read, leaves the dead dated from the "
          "last save, and a dead standby, a starting engine or an unknown slot gets no row",
          "[supervisor][adopter]") {
  {
    // A starting engine that died is restarted with no date of its own.
    AdopterRig q;
    RuntimeState starting;
    starting.engines = {Recorded("a", 100, 9001, "starting")};
    q.adopter.Adopt(starting);
    CHECK(q.asks.empty());
    CHECK(q.dated.empty());
  }
  AdopterRig r;
  RuntimeState prev;
  prev.saved_ms = kSaved;
  prev.engines = {Recorded("a", 100, 9001, "active"), Recorded("b", 200, 9002, "standby"),
                  Recorded("c", 300, 9003, "active")};
  r.adopter.Adopt(prev);
  CHECK(r.dated.count("c") == 0);
  REQUIRE(r.asks.size() == 1);
  SECTION("no answer") { r.asks[0](nullptr); }
  SECTION("an answer that cannot be read") {
    json bad = {{"events", "not a list"}};
    r.asks[0](&bad);
  }
  REQUIRE(r.rows.size() == 1);  // the active one only
  CHECK(r.rows[0].from_slot == "a");
  CHECK(r.rows[0].to_slot == "none");
  CHECK(r.rows[0].fault_ms == kSaved);
  CHECK(r.dated["b"].first == kSaved);
  CHECK_FALSE(r.dated["b"].second);
}

}  // namespace
}  // namespace wsup
