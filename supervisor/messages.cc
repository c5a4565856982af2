#include "supervisor/messages.h"

#include <cmath>

#include "common/json_fields.h"

namespace wsup {

using nlohmann::json;

namespace {

constexpr const char* kTypes = "use status, failover, reload or stop";
constexpr const char* kDrill =
    "send {\"type\":\"failover\",\"drill\":true} for a planned drill, with \"kill\":true for a crash drill "
    "(`wsup failover --drill [--kill]`)";

// A peer's string, cut and with control bytes escaped, for a message.
std::string Shown(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 64)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return s.size() > 64 ? out + "..." : out;
}

}  // namespace

Result<ControlRequest> ParseControlRequest(const json& msg) {
  if (!msg.is_object()) {
    return InvalidArgument(std::string("a request must be a JSON object, not ") + JsonTypeName(msg) + "; " + kTypes);
  }
  auto type = Field<std::string>(msg, "type");
  if (!type.ok()) return InvalidArgument("request: " + type.error().message() + "; " + kTypes);
  ControlRequest r;
  if (*type == "status") {
    r.kind = ControlRequest::Kind::kStatus;
  } else if (*type == "reload") {
    r.kind = ControlRequest::Kind::kReload;
    constexpr const char* kSet = "send \"set\" as an array of \"section.key=value\" strings";
    auto set = ArrayFieldOr(msg, "set");
    if (!set.ok()) return InvalidArgument("'reload' request: " + set.error().message() + "; " + kSet);
    if (*set) {
      for (size_t i = 0; i < (*set)->size(); ++i) {
        const json& v = (**set)[i];
        if (!v.is_string()) {
          return InvalidArgument("'reload' request: set[" + std::to_string(i) + "] is " + JsonTypeName(v) +
                                 ", not a string; " + kSet);
        }
        r.set.push_back(v.get<std::string>());
      }
    }
  } else if (*type == "stop") {
    r.kind = ControlRequest::Kind::kStop;
  } else if (*type == "failover") {
    r.kind = ControlRequest::Kind::kFailover;
    auto drill = FieldOr<bool>(msg, "drill", false);
    if (!drill.ok()) return InvalidArgument("'failover' request: " + drill.error().message() + "; " + kDrill);
    auto kill = FieldOr<bool>(msg, "kill", false);
    if (!kill.ok()) return InvalidArgument("'failover' request: " + kill.error().message() + "; " + kDrill);
    if (!*drill) return InvalidArgument("only drills can be asked for: send {\"type\":\"failover\",\"drill\":true}");
    r.kill = *kill;
  } else {
    return InvalidArgument("unknown request type '" + Shown(*type) + "'; " + kTypes);
  }
  return r;
}

bool IsFrontEvent(const json& m) {
  auto type = FieldOr<std::string>(m, "type", "");
  return type.ok() && *type == "event";
}

Result<FrontMessage> ParseFrontMessage(const json& m) {
  FrontMessage f;
  WSUP_ASSIGN_OR_RETURN(std::string type, FieldOr<std::string>(m, "type", ""));
  if (type == "event") {
    WSUP_ASSIGN_OR_RETURN(std::string kind, FieldOr<std::string>(m, "kind", ""));
    if (kind == "switched") {
      f.kind = FrontMessage::Kind::kSwitched;
      WSUP_ASSIGN_OR_RETURN(f.from, FieldOr<std::string>(m, "from", ""));
      WSUP_ASSIGN_OR_RETURN(f.to, FieldOr<std::string>(m, "to", ""));
      WSUP_ASSIGN_OR_RETURN(f.reason, FieldOr<std::string>(m, "reason", ""));
      WSUP_ASSIGN_OR_RETURN(f.at_ms, FieldOr<int64_t>(m, "at_ms", 0));
    } else if (kind == "silent") {
      f.kind = FrontMessage::Kind::kSilent;
      WSUP_ASSIGN_OR_RETURN(f.backend, FieldOr<std::string>(m, "backend", ""));
      WSUP_ASSIGN_OR_RETURN(f.silent, FieldOr<int64_t>(m, "silent", 0));
      WSUP_ASSIGN_OR_RETURN(f.inflight, FieldOr<int64_t>(m, "inflight", 0));
      WSUP_ASSIGN_OR_RETURN(f.after_ms, FieldOr<int64_t>(m, "after_ms", 0));
      WSUP_ASSIGN_OR_RETURN(f.last_byte_ms, FieldOr<int64_t>(m, "last_byte_ms", 0));
    } else if (kind == "first_ok") {
      f.kind = FrontMessage::Kind::kFirstOk;
      WSUP_ASSIGN_OR_RETURN(f.backend, FieldOr<std::string>(m, "backend", ""));
      WSUP_ASSIGN_OR_RETURN(f.at_ms, FieldOr<int64_t>(m, "at_ms", 0));
    }
    return f;
  }
  if (m.contains("cut")) {
    f.kind = FrontMessage::Kind::kCut;
    WSUP_ASSIGN_OR_RETURN(f.cut, Field<int64_t>(m, "cut"));
  } else if (m.contains("ok") && m.contains("epoch")) {
    f.kind = FrontMessage::Kind::kRoutesAck;
  }
  return f;
}

Result<int64_t> FrontInflight(const json& status, const std::string& address) {
  WSUP_ASSIGN_OR_RETURN(const json* inflight, ObjectFieldOr(status, "inflight"));
  if (!inflight) return int64_t{0};
  auto n = FieldOr<int64_t>(*inflight, address, 0);
  if (!n.ok()) return n.error().With("inflight");
  return n;
}

Result<FrontLog> ParseFrontLog(const json& status) {
  FrontLog log;
  WSUP_ASSIGN_OR_RETURN(const json* events, ArrayFieldOr(status, "events"));
  if (events) {
    for (size_t i = 0; i < events->size(); ++i) {
      const json& ev = (*events)[i];
      const std::string where = "events[" + std::to_string(i) + "]";
      auto kind = FieldOr<std::string>(ev, "kind", "");
      if (!kind.ok()) return kind.error().With(where);
      if (*kind != "switched") continue;
      FrontLog::Switch sw;
      for (auto [key, out] : {std::pair<const char*, std::string*>{"from", &sw.from}, {"to", &sw.to},
                              {"reason", &sw.reason}}) {
        auto v = FieldOr<std::string>(ev, key, "");
        if (!v.ok()) return v.error().With(where);
        *out = std::move(*v);
      }
      auto at = FieldOr<int64_t>(ev, "at_ms", 0);
      if (!at.ok()) return at.error().With(where);
      sw.at_ms = *at;
      log.switches.push_back(std::move(sw));
    }
  }
  WSUP_ASSIGN_OR_RETURN(const json* backends, ObjectFieldOr(status, "backends"));
  if (backends) {
    for (const auto& [address, b] : backends->items()) {
      auto failed = FieldOr<int64_t>(b, "failed_at_ms", 0);
      if (!failed.ok()) return failed.error().With("backends['" + Shown(address) + "']");
      if (*failed > 0) log.failed_at_ms[address] = *failed;
    }
  }
  return log;
}

Result<EngineStatus> ParseEngineStatus(const json& st) {
  EngineStatus s;
  WSUP_ASSIGN_OR_RETURN(s.state, FieldOr<std::string>(st, "state", ""));
  WSUP_ASSIGN_OR_RETURN(const json* comm, ObjectFieldOr(st, "comm"));
  if (comm) {
    auto warm = FieldOr<bool>(*comm, "warm", false);
    if (!warm.ok()) return warm.error().With("comm");
    s.comm_warm = *warm;
  }
  WSUP_ASSIGN_OR_RETURN(const json* weights, ObjectFieldOr(st, "weights"));
  if (weights) {
    EngineStatus::Weights w;
    for (auto [key, out] : {std::pair<const char*, std::string*>{"mode", &w.mode}, {"source", &w.source},
                            {"miss_reason", &w.miss_reason}}) {
      auto v = FieldOr<std::string>(*weights, key, "");
      if (!v.ok()) return v.error().With("weights");
      *out = std::move(*v);
    }
    // Milliseconds, whole or not (engines in other languages send floats).
    auto ms = FieldOr<double>(*weights, "ms", -1);
    if (!ms.ok()) return ms.error().With("weights");
    if (*ms >= 0 && *ms < 9e15) w.ms = std::llround(*ms);
    if (weights->contains("diffs")) {
      w.diffs_json = (*weights)["diffs"].dump(-1, ' ', false, json::error_handler_t::replace);
    }
    s.weights = std::move(w);
  }
  return s;
}

}  // namespace wsup
