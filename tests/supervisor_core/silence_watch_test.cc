// SilenceWatch (supervisor/silence_watch.h) on its own: the active engine,
// the front's routes and /proc behind its hooks, and the probe made at once
// held by the test, which answers it when it chooses. Each test checks what
// was tripped, what was counted, and how many probes were made.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "supervisor/silence_watch.h"
#include "tests/fake_timers.h"

namespace wsup {
namespace {

using testing::FakeTimers;

// A probe answered by the test.
class HeldProbe final : public Probe {
 public:
  explicit HeldProbe(std::vector<Callback>* asks) : asks_(asks) {}
  const char* kind() const override { return "held"; }
  void Run(Callback done) override { asks_->push_back(std::move(done)); }
  void Cancel() override {}

 private:
  std::vector<Callback>* asks_;
};

struct SilenceRig {
  FakeClock clock;
  FakeTimers timers{&clock};
  // The active engine (none when unset), what the front routes to, and
  // whether a proven standby waits.
  std::optional<SilenceWatch::Engine> active = SilenceWatch::Engine{"a", 4242, "127.0.0.1:9001"};
  std::string routed = "127.0.0.1:9001";
  bool standby = true;
  // /proc's state letter of the active engine; an error when unset.
  std::optional<char> run_state = 'S';
  int state_reads = 0;
  std::map<std::string, int64_t> last_byte;
  std::vector<Probe::Callback> probes;  // made and unanswered
  int probes_made = 0;
  std::vector<std::string> trips;  // "slot: why"
  std::map<std::string, int> counted;
  bool stopping = false;
  std::unique_ptr<SilenceWatch> watch;

  SilenceRig() {
    SilenceWatch::Hooks h;
    h.stopping = [this] { return stopping; };
    h.active = [this] { return active; };
    h.routed = [this] { return routed; };
    h.standby_ready = [this] { return standby; };
    h.run_state = [this](pid_t) -> Result<char> {
      state_reads++;
      if (!run_state) return NotFound("/proc/4242/stat: gone");
      return *run_state;
    };
    h.last_byte = [this](const std::string& slot, int64_t ms) { last_byte[slot] = ms; };
    h.make_probe = [this](const SilenceWatch::Engine&) -> std::unique_ptr<Probe> {
      probes_made++;
      return std::make_unique<HeldProbe>(&probes);
    };
    h.trip = [this](const std::string& slot, const std::string& why) { trips.push_back(slot + ": " + why); };
    h.counted = [this](const char* outcome) { counted[outcome]++; };
    watch = std::make_unique<SilenceWatch>(timers, std::move(h));
  }

  static FrontMessage Report(const std::string& backend, int64_t last_byte_ms = 0) {
    FrontMessage m;
    m.kind = FrontMessage::Kind::kSilent;
    m.backend = backend;
    m.silent = 3;
    m.inflight = 5;
    m.after_ms = 2000;
    m.last_byte_ms = last_byte_ms;
    return m;
  }

  // Answers the oldest probe, then lets the watch free it.
  void Answer(bool ok, const std::string& reason = "") {
    REQUIRE_FALSE(probes.empty());
    auto done = std::move(probes.front());
    probes.erase(probes.begin());
    ProbeOutcome o;
    o.ok = ok;
    o.reason = reason;
    done(o);
    timers.Advance(0);
  }
};

TEST_CASE("silence watch: a report of an engine that is not the active one, or with no standby, is only counted",
          "[supervisor][silence]") {
  SilenceRig r;
  SECTION("another backend") { r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9002", 77)); }
  SECTION("the front routes elsewhere") {
    r.routed = "127.0.0.1:9002";
    r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001", 77));
  }
  SECTION("no active engine") {
    r.active.reset();
    r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001", 77));
  }
  SECTION("no proven standby") {
    r.standby = false;
    r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001"));
  }
  SECTION("its process cannot be read") {
    r.run_state.reset();
    r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001"));
  }
  SECTION("its process is exiting") {
    r.run_state = 'Z';
    r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001"));
  }
  CHECK(r.counted == std::map<std::string, int>{{"ignored", 1}});
  CHECK(r.trips.empty());
  CHECK(r.probes_made == 0);
  CHECK(r.last_byte.empty());
}

TEST_CASE("silence watch: a stopped engine is tripped at once, with no probe, and its last byte is kept",
          "[supervisor][silence]") {
  SilenceRig r;
  r.run_state = 'T';
  r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001", 1234));
  REQUIRE(r.trips.size() == 1);
  CHECK(r.trips[0].rfind("a: the front saw 3 of 5 requests on 127.0.0.1:9001 get no byte for 2000 ms", 0) == 0);
  CHECK(r.trips[0].find("stopped") != std::string::npos);
  CHECK(r.counted == std::map<std::string, int>{{"tripped", 1}});
  CHECK(r.probes_made == 0);
  CHECK(r.last_byte == std::map<std::string, int64_t>{{"a", 1234}});
}

TEST_CASE("silence watch: a running engine is probed once, tripped if the probe fails, left alone if it passes",
          "[supervisor][silence]") {
  SilenceRig r;
  r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001"));
  REQUIRE(r.probes_made == 1);
  CHECK(r.watch->probing());
  // More reports while the probe runs make no second probe.
  r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001"));
  r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001"));
  CHECK(r.probes_made == 1);
  CHECK(r.trips.empty());
  SECTION("the probe fails") {
    r.Answer(false, "timed out after 500 ms");
    REQUIRE(r.trips.size() == 1);
    CHECK(r.trips[0].find("a probe made at once failed: timed out after 500 ms") != std::string::npos);
    CHECK(r.counted == std::map<std::string, int>{{"tripped", 1}});
  }
  SECTION("the probe passes") {
    r.Answer(true);
    CHECK(r.trips.empty());
    CHECK(r.counted == std::map<std::string, int>{{"dismissed", 1}});
  }
  // Freed once answered: the next report probes again.
  CHECK_FALSE(r.watch->probing());
  r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001"));
  CHECK(r.probes_made == 2);
}

TEST_CASE("silence watch: a probe's answer about an engine that has moved on trips nothing", "[supervisor][silence]") {
  SilenceRig r;
  r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001"));
  REQUIRE(r.probes_made == 1);
  SECTION("a new process in the slot") { r.active->pid = 5151; }
  SECTION("the other slot is active now") { r.active = SilenceWatch::Engine{"b", 6161, "127.0.0.1:9002"}; }
  SECTION("the node is stopping") { r.stopping = true; }
  r.Answer(false, "connection refused");
  CHECK(r.trips.empty());
  CHECK(r.counted.empty());
  CHECK_FALSE(r.watch->probing());
}

TEST_CASE("silence watch: a report about a new process of the slot probes it though the old one's probe runs",
          "[supervisor][silence]") {
  SilenceRig r;
  r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001"));
  r.active->pid = 5151;
  r.watch->OnSilent(SilenceRig::Report("127.0.0.1:9001"));
  REQUIRE(r.probes_made == 2);
  // The first probe was dropped with the process it asked about; the
  // second one's failure trips the new process.
  r.probes.erase(r.probes.begin());
  r.Answer(false, "wrong answer");
  REQUIRE(r.trips.size() == 1);
  CHECK(r.trips[0].find("wrong answer") != std::string::npos);
}

}  // namespace
}  // namespace wsup
