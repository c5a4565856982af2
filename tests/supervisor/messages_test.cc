// What the supervisor reads from other processes (supervisor/messages.h):
// the CLI's requests, the front's messages and an engine's status, typed,
// with every field of another type an error that names it.
#include "supervisor/messages.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace wsup {
namespace {

using nlohmann::json;

std::string RefusalOf(const json& msg) {
  auto r = ParseControlRequest(msg);
  INFO(msg.dump());
  REQUIRE_FALSE(r.ok());
  return r.error().message();
}

TEST_CASE("control requests: what the CLI sends is accepted, typed", "[messages]") {
  CHECK(ParseControlRequest(json{{"type", "status"}})->kind == ControlRequest::Kind::kStatus);
  CHECK(ParseControlRequest(json{{"type", "reload"}})->kind == ControlRequest::Kind::kReload);
  CHECK(ParseControlRequest(json{{"type", "stop"}})->kind == ControlRequest::Kind::kStop);
  auto planned = ParseControlRequest(json{{"type", "failover"}, {"drill", true}, {"kill", false}});
  REQUIRE(planned.ok());
  CHECK(planned->kind == ControlRequest::Kind::kFailover);
  CHECK_FALSE(planned->kill);
  auto crash = ParseControlRequest(json{{"type", "failover"}, {"drill", true}, {"kill", true}});
  REQUIRE(crash.ok());
  CHECK(crash->kill);
  // Fields a request does not need are ignored: a newer CLI may add some.
  CHECK(ParseControlRequest(json{{"type", "status"}, {"verbose", 3}}).ok());
  CHECK(ParseControlRequest(json{{"type", "failover"}, {"drill", true}, {"kill", nullptr}}).ok());
}

TEST_CASE("control requests: a field of another type is refused, naming the field, its type and the type it needs",
          "[messages]") {
  // The messages of issue 32: each ended the supervisor.
  CHECK(RefusalOf(json{{"type", "failover"}, {"drill", true}, {"kill", 3}}).rfind(
            "'failover' request: field 'kill' is an integer (3), not true or false; send "
            "{\"type\":\"failover\",\"drill\":true}",
            0) == 0);
  CHECK(RefusalOf(json{{"type", 1}}) ==
        "request: field 'type' is an integer (1), not a string; use status, failover, reload or stop");
  CHECK(RefusalOf(json{{"type", "failover"}, {"drill", "yes"}}).rfind(
            "'failover' request: field 'drill' is a string (\"yes\"), not true or false", 0) == 0);
  CHECK(RefusalOf(json::object()) ==
        "request: field 'type' is missing; it must be a string; use status, failover, reload or stop");
  CHECK(RefusalOf(json{{"type", {{"a", 1}}}}).find("field 'type' is an object") != std::string::npos);
  CHECK(RefusalOf(json{{"type", "failover"}}) ==
        "only drills can be asked for: send {\"type\":\"failover\",\"drill\":true}");
  CHECK(RefusalOf(json{{"type", "failover"}, {"drill", false}, {"kill", true}}).rfind("only drills", 0) == 0);
  CHECK(RefusalOf(json{{"type", "reboot"}}) == "unknown request type 'reboot'; use status, failover, reload or stop");
  // A peer's type is cut and its control bytes escaped in the reply.
  std::string odd = RefusalOf(json{{"type", std::string("a\nb") + std::string(100, 'x')}});
  CHECK(odd.find("a\\x0ab") != std::string::npos);
  CHECK(odd.find('\n') == std::string::npos);
  CHECK(odd.size() < 160);
  CHECK(RefusalOf(json::array({1, 2})).rfind("a request must be a JSON object", 0) == 0);
}

TEST_CASE("front messages: events and replies typed, a field of another type is an error", "[messages]") {
  auto sw = ParseFrontMessage(json{{"type", "event"}, {"kind", "switched"}, {"from", "h:1"}, {"to", "h:2"},
                                   {"reason", "refused"}, {"at_ms", 5}});
  REQUIRE(sw.ok());
  CHECK(sw->kind == FrontMessage::Kind::kSwitched);
  CHECK(sw->from == "h:1");
  CHECK(sw->to == "h:2");
  CHECK(sw->reason == "refused");
  auto silent = ParseFrontMessage(json{{"type", "event"}, {"kind", "silent"}, {"backend", "h:1"}, {"silent", 2},
                                       {"inflight", 5}, {"after_ms", 200}, {"last_byte_ms", 77}});
  REQUIRE(silent.ok());
  CHECK(silent->kind == FrontMessage::Kind::kSilent);
  CHECK(silent->silent == 2);
  CHECK(silent->inflight == 5);
  CHECK(silent->after_ms == 200);
  CHECK(silent->last_byte_ms == 77);
  auto first = ParseFrontMessage(json{{"type", "event"}, {"kind", "first_ok"}, {"backend", "h:2"}});
  REQUIRE(first.ok());
  CHECK(first->kind == FrontMessage::Kind::kFirstOk);
  CHECK(first->at_ms == 0);
  CHECK(ParseFrontMessage(json{{"ok", true}, {"cut", 3}})->cut == 3);
  CHECK(ParseFrontMessage(json{{"ok", true}, {"epoch", 4}})->kind == FrontMessage::Kind::kRoutesAck);
  CHECK(ParseFrontMessage(json{{"type", "event"}, {"kind", "newer"}})->kind == FrontMessage::Kind::kOther);

  auto bad_at = ParseFrontMessage(json{{"type", "event"}, {"kind", "first_ok"}, {"at_ms", "soon"}});
  REQUIRE_FALSE(bad_at.ok());
  CHECK(bad_at.error().message() == "field 'at_ms' is a string (\"soon\"), not an integer");
  CHECK_FALSE(ParseFrontMessage(json{{"type", 7}}).ok());
  CHECK_FALSE(ParseFrontMessage(json{{"type", "event"}, {"kind", "silent"}, {"silent", true}}).ok());
  CHECK_FALSE(ParseFrontMessage(json{{"ok", true}, {"cut", "all"}}).ok());
  CHECK(IsFrontEvent(json{{"type", "event"}}));
  CHECK_FALSE(IsFrontEvent(json{{"type", 1}}));
  CHECK_FALSE(IsFrontEvent(json{{"type", "status"}}));
}

TEST_CASE("front status: in-flight counts and the switch log, every field checked", "[messages]") {
  const json status = {
      {"inflight", {{"h:1", 3}}},
      {"events", json::array({{{"type", "event"}, {"kind", "silent"}, {"backend", "h:1"}},
                              {{"type", "event"}, {"kind", "switched"}, {"from", "h:1"}, {"to", "h:2"}, {"at_ms", 9}}})},
      {"backends", {{"h:1", {{"failed_at_ms", 8}}}, {"h:2", {{"route", "standby"}}}}}};
  CHECK(*FrontInflight(status, "h:1") == 3);
  CHECK(*FrontInflight(status, "h:2") == 0);
  CHECK(*FrontInflight(json::object(), "h:1") == 0);
  CHECK(FrontInflight(json{{"inflight", {{"h:1", "3"}}}}, "h:1").error().message() ==
        "inflight: field 'h:1' is a string (\"3\"), not an integer");
  CHECK_FALSE(FrontInflight(json{{"inflight", 3}}, "h:1").ok());

  auto log = ParseFrontLog(status);
  REQUIRE(log.ok());
  REQUIRE(log->switches.size() == 1);
  CHECK(log->switches[0].from == "h:1");
  CHECK(log->switches[0].to == "h:2");
  CHECK(log->switches[0].at_ms == 9);
  CHECK(log->failed_at_ms.size() == 1);
  CHECK(log->failed_at_ms.at("h:1") == 8);
  auto bad = ParseFrontLog(json{{"events", json::array({{{"kind", "switched"}, {"at_ms", true}}})}});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message() == "events[0]: field 'at_ms' is true or false (true), not an integer");
  CHECK_FALSE(ParseFrontLog(json{{"events", json::array({3})}}).ok());
  CHECK_FALSE(ParseFrontLog(json{{"backends", {{"h:1", {{"failed_at_ms", -0.5}}}}}}).ok());
  CHECK_FALSE(ParseFrontLog(json{{"events", "none"}}).ok());
}

TEST_CASE("engine status: state, comm and weights read, a field of another type is an error", "[messages]") {
  auto st = ParseEngineStatus(json{{"state", "ready"},
                                   {"comm", {{"warm", true}}},
                                   {"weights", {{"mode", "daemon"}, {"source", "holder"}, {"ms", 12.6}}}});
  REQUIRE(st.ok());
  CHECK(st->state == "ready");
  CHECK(st->comm_warm == std::optional<bool>(true));
  REQUIRE(st->weights);
  CHECK(st->weights->source == "holder");
  CHECK(st->weights->ms == std::optional<int64_t>(13));
  auto miss = ParseEngineStatus(json{{"state", "ready"},
                                     {"weights", {{"source", "disk"}, {"miss_reason", "fingerprint"},
                                                  {"diffs", json::array({{{"field", "revision"}}})}}}});
  REQUIRE(miss.ok());
  CHECK(miss->weights->mode.empty());
  CHECK_FALSE(miss->weights->ms);
  CHECK(miss->weights->diffs_json == "[{\"field\":\"revision\"}]");
  CHECK(ParseEngineStatus(json{{"state", "loading"}})->state == "loading");

  CHECK(ParseEngineStatus(json{{"state", 1}}).error().message() == "field 'state' is an integer (1), not a string");
  CHECK(ParseEngineStatus(json{{"comm", {{"warm", "yes"}}}}).error().message() ==
        "comm: field 'warm' is a string (\"yes\"), not true or false");
  CHECK(ParseEngineStatus(json{{"weights", {{"ms", "12"}}}}).error().message() ==
        "weights: field 'ms' is a string (\"12\"), not a number");
  CHECK_FALSE(ParseEngineStatus(json{{"weights", 3}}).ok());
  CHECK_FALSE(ParseEngineStatus(json("ready")).ok());
}

}  // namespace
}  // namespace wsup
