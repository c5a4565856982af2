#include "front/status_merge.h"

#include <algorithm>

namespace wsup::front {

namespace {

int64_t Int(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : 0;
}

void SumInto(nlohmann::json& into, const nlohmann::json& from) {
  for (const auto& [key, value] : from.items()) {
    if (!value.is_number()) continue;
    into[key] = Int(into, key.c_str()) + value.get<int64_t>();
  }
}

void MergeBackend(nlohmann::json& into, const nlohmann::json& from) {
  if (into.is_null()) {
    into = from;
    return;
  }
  into["inflight"] = Int(into, "inflight") + Int(from, "inflight");
  into["failures"] = std::max(Int(into, "failures"), Int(from, "failures"));
  if (Int(from, "failed_at_ms") > Int(into, "failed_at_ms")) {
    into["failed_at_ms"] = from["failed_at_ms"];
    into["error"] = from.value("error", "");
  }
  for (const char* key : {"last_ok_ms", "last_byte_ms"}) {
    if (Int(from, key) > Int(into, key)) into[key] = from[key];
  }
}

}  // namespace

nlohmann::json MergeLoopStatus(const std::vector<nlohmann::json>& parts) {
  nlohmann::json out;
  nlohmann::json inflight = nlohmann::json::object();
  nlohmann::json down = nlohmann::json::object();
  nlohmann::json backends = nlohmann::json::object();
  nlohmann::json counters = nlohmann::json::object();
  int64_t queued = 0;
  for (const auto& p : parts) {
    if (!p.is_object()) continue;
    if (out.is_null()) {
      for (const char* key : {"active", "standby", "epoch", "hedging"}) {
        if (p.contains(key)) out[key] = p[key];
      }
    }
    queued += Int(p, "queued");
    if (p.contains("inflight")) SumInto(inflight, p["inflight"]);
    if (p.contains("counters")) SumInto(counters, p["counters"]);
    if (p.contains("down")) {
      for (const auto& [name, d] : p["down"].items()) {
        if (!down.contains(name) || Int(d, "for_ms") > Int(down[name], "for_ms")) down[name] = d;
      }
    }
    if (p.contains("backends")) {
      for (const auto& [name, b] : p["backends"].items()) MergeBackend(backends[name], b);
    }
  }
  if (out.is_null()) out = nlohmann::json::object();
  out["inflight"] = std::move(inflight);
  out["queued"] = queued;
  out["down"] = std::move(down);
  out["backends"] = std::move(backends);
  out["counters"] = std::move(counters);
  out["events"] = nlohmann::json::array();
  return out;
}

}  // namespace wsup::front
