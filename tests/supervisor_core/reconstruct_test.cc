// ReconstructFailovers (supervisor/reconstruct.h): the engines that died while
// no supervisor ran, dated from the front's log, the predecessor's last saved
// state, or now; a failover row only for one that was active.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "supervisor/reconstruct.h"

namespace wsup {
namespace {

constexpr int64_t kSaved = 10'000;
constexpr int64_t kNow = 50'000;

ReconstructFacts Facts(const FrontLog* log, std::string active = "b") {
  ReconstructFacts f;
  f.saved_ms = kSaved;
  f.now_ms = kNow;
  f.front_log = log;
  f.slots = {{"a", "127.0.0.1:9001"}, {"b", "127.0.0.1:9002"}};
  f.active = std::move(active);
  return f;
}

const LostEngine kActiveA{"a", 4242, "active", "127.0.0.1:9001"};

TEST_CASE("reconstruct: the front's own switch dates the failover, and names where the traffic went",
          "[supervisor][reconstruct]") {
  FrontLog log;
  log.switches.push_back({"127.0.0.1:9001", "127.0.0.1:9002", "connect refused", 20'000});
  // A switch before the predecessor's last save is an older story.
  log.switches.push_back({"127.0.0.1:9001", "127.0.0.1:9002", "old", 9'000});
  log.failed_at_ms["127.0.0.1:9001"] = 19'000;
  const auto out = ReconstructFailovers({kActiveA}, Facts(&log, ""));
  REQUIRE(out.size() == 1);
  CHECK(out[0].slot == "a");
  CHECK(out[0].fault_ms == 20'000);
  REQUIRE(out[0].failover);
  const FailoverRecord& r = *out[0].failover;
  CHECK(r.trigger == "crash");
  CHECK(r.reconstructed);
  CHECK(r.from_slot == "a");
  CHECK(r.to_slot == "b");  // the slot at the address the front switched to
  CHECK(r.fault_ms == 20'000);
  CHECK(r.detected_ms == 20'000);
  CHECK(r.swapped_ms == 20'000);
  CHECK(r.reason ==
        "engine a (pid 4242) died while no supervisor ran; the front switched to 127.0.0.1:9002 by itself: "
        "connect refused (reconstructed at restart)");
}

TEST_CASE("reconstruct: without a switch, the front's first failure of the engine dates it, and the swap is now",
          "[supervisor][reconstruct]") {
  FrontLog log;
  log.failed_at_ms["127.0.0.1:9001"] = 12'000;
  const auto out = ReconstructFailovers({kActiveA}, Facts(&log));
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].failover);
  CHECK(out[0].failover->fault_ms == 12'000);
  CHECK(out[0].failover->detected_ms == 12'000);
  CHECK(out[0].failover->swapped_ms == kNow);
  CHECK(out[0].failover->to_slot == "b");  // active now
  CHECK(out[0].failover->reason.find("the front had not switched by itself") != std::string::npos);
}

TEST_CASE("reconstruct: with no word from the front, the predecessor's last save dates it, else now",
          "[supervisor][reconstruct]") {
  FrontLog stale;
  stale.failed_at_ms["127.0.0.1:9001"] = 9'000;  // before the last save: not this death
  SECTION("no log") {
    const auto out = ReconstructFailovers({kActiveA}, Facts(nullptr));
    CHECK(out.at(0).fault_ms == kSaved);
    CHECK(out.at(0).failover->detected_ms == kNow);
  }
  SECTION("only an older failure in the log") {
    const auto out = ReconstructFailovers({kActiveA}, Facts(&stale));
    CHECK(out.at(0).fault_ms == kSaved);
  }
  SECTION("no saved time either") {
    // The front's 0 means "never failed", not a time.
    FrontLog never;
    never.failed_at_ms["127.0.0.1:9001"] = 0;
    ReconstructFacts f = Facts(&never);
    f.saved_ms = 0;
    const auto out = ReconstructFailovers({kActiveA}, f);
    CHECK(out.at(0).fault_ms == kNow);
    CHECK(out.at(0).failover->detected_ms == kNow);
  }
}

TEST_CASE("reconstruct: a standby that died is dated but gets no failover row, and with nothing active a row goes to none",
          "[supervisor][reconstruct]") {
  FrontLog log;
  log.failed_at_ms["127.0.0.1:9002"] = 30'000;
  const LostEngine standby{"b", 5151, "standby", "127.0.0.1:9002"};
  const auto out = ReconstructFailovers({kActiveA, standby}, Facts(&log, ""));
  REQUIRE(out.size() == 2);
  CHECK(out[0].failover->to_slot == "none");
  CHECK(out[1].slot == "b");
  CHECK(out[1].fault_ms == 30'000);
  CHECK_FALSE(out[1].failover);
}

}  // namespace
}  // namespace wsup
