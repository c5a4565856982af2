// FrontProbe (supervisor/front_probe.h) on its own: the front behind a fake
// sender that the test answers, a fake clock and fake timers. Each test
// checks what was asked of the front, how often, and what done was told.
#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "supervisor/front_probe.h"
#include "tests/fake_timers.h"

namespace wsup {
namespace {

using testing::FakeTimers;

struct ProbeRig {
  FakeClock clock;
  FakeTimers timers{&clock};
  SemanticProbeSpec spec;
  bool stopping = false;
  struct Sent {
    http::ClientRequest req;
    http::ResponseCallback done;
  };
  std::vector<Sent> sent;
  // What done was told: ok and the time.
  std::vector<std::pair<bool, int64_t>> told;
  std::unique_ptr<FrontProbe> probe;

  ProbeRig() {
    spec.prompt = "The capital of France is";
    spec.expect = " Paris";
    spec.timeout_ms = 300;
    FrontProbe::Hooks h;
    h.stopping = [this] { return stopping; };
    h.spec = [this] { return spec; };
    h.queue_ms = [] { return int64_t{5000}; };
    h.send = [this](http::ClientRequest req, http::ResponseCallback done) {
      sent.push_back({std::move(req), std::move(done)});
    };
    probe = std::make_unique<FrontProbe>(timers, clock, std::move(h));
  }

  void Run(int attempts) {
    probe->Run([this](bool ok, int64_t at) { told.emplace_back(ok, at); }, attempts);
  }

  // Answers the latest request with a completion whose text is `text`.
  void AnswerText(const std::string& text) {
    REQUIRE_FALSE(sent.empty());
    clock.AdvanceMs(4);
    sent.back().done(http::HttpResponse::Json(
        200, R"({"choices":[{"text":")" + text + R"(","finish_reason":"length"}]})"));
  }
  void AnswerError(Error e) {
    REQUIRE_FALSE(sent.empty());
    sent.back().done(std::move(e));
  }
};

TEST_CASE("front probe: one passing answer is done at once, with the answer's wall time", "[supervisor][front_probe]") {
  ProbeRig r;
  r.Run(200);
  REQUIRE(r.sent.size() == 1);
  const http::ClientRequest& req = r.sent[0].req;
  CHECK(req.method == "POST");
  CHECK(req.target == "/v1/completions");
  CHECK(req.body.find("The capital of France is") != std::string::npos);
  // The probe's timeout is raised to the floor, and the front's queue is
  // added: a front with no engine routed yet holds the request that long.
  CHECK(req.timeout_ms == FrontProbe::kMinTimeoutMs + 5000);
  const int64_t before = r.clock.WallMs();
  r.AnswerText(" Paris");
  REQUIRE(r.told.size() == 1);
  CHECK(r.told[0].first);
  CHECK(r.told[0].second == before + 4);
  CHECK(r.timers.Advance(1000) == 0);
  CHECK(r.sent.size() == 1);
}

TEST_CASE("front probe: a failed attempt is made again 10 ms later until one passes", "[supervisor][front_probe]") {
  ProbeRig r;
  r.Run(200);
  r.AnswerError(Unavailable("connection refused"));
  CHECK(r.told.empty());
  // The retry waits its pause, on the timers: nothing is sent before it.
  r.timers.Advance(FrontProbe::kRetryMs - 1);
  CHECK(r.sent.size() == 1);
  r.timers.Advance(1);
  REQUIRE(r.sent.size() == 2);
  r.AnswerText(" Lyon");  // answered, but wrongly: not yet proven
  r.timers.Advance(FrontProbe::kRetryMs);
  REQUIRE(r.sent.size() == 3);
  // A reload changed the expected answer meanwhile: the next attempt asks for it.
  r.spec.expect = " Lyon";
  r.AnswerText(" Lyon");
  CHECK(r.told.empty());
  r.timers.Advance(FrontProbe::kRetryMs);
  REQUIRE(r.sent.size() == 4);
  r.AnswerText(" Lyon");
  REQUIRE(r.told.size() == 1);
  CHECK(r.told[0].first);
}

TEST_CASE("front probe: done is told of the failure once the attempts are spent or the node stops",
          "[supervisor][front_probe]") {
  ProbeRig r;
  SECTION("three attempts") {
    r.Run(3);
    for (int i = 0; i < 3; ++i) {
      REQUIRE(r.sent.size() == static_cast<size_t>(i + 1));
      r.AnswerError(Unavailable("connection refused"));
      r.timers.Advance(FrontProbe::kRetryMs);
    }
    CHECK(r.sent.size() == 3);
  }
  SECTION("the node stops") {
    r.Run(200);
    r.AnswerError(Unavailable("connection refused"));
    r.timers.Advance(FrontProbe::kRetryMs);
    r.stopping = true;
    r.AnswerError(Unavailable("connection refused"));
    r.timers.Advance(FrontProbe::kRetryMs);
    CHECK(r.sent.size() == 2);
  }
  REQUIRE(r.told.size() == 1);
  CHECK_FALSE(r.told[0].first);
  CHECK(r.told[0].second == 0);
}

TEST_CASE("front probe: an answer that comes after the probe is gone is dropped", "[supervisor][front_probe]") {
  ProbeRig r;
  r.Run(200);
  REQUIRE(r.sent.size() == 1);
  http::ResponseCallback late = std::move(r.sent[0].done);
  r.probe.reset();
  late(http::HttpResponse::Json(200, R"({"choices":[{"text":" Paris"}]})"));
  CHECK(r.told.empty());
  CHECK(r.timers.Advance(1000) == 0);
}

}  // namespace
}  // namespace wsup
