#include "supervisor/expectation_check.h"

#include <set>

#include <nlohmann/json.hpp>

namespace wsup {
namespace {

std::string Ids(const std::vector<int64_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

std::string Quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// A whole completion: ended by the model, or by max_tokens after exactly
// that many tokens.
bool Complete(const ProbeAnswer& a, int max_tokens) {
  if (a.token_ids.empty()) return false;
  if (a.finish_reason == "stop") return true;
  return a.finish_reason == "length" && static_cast<int64_t>(a.token_ids.size()) == max_tokens;
}

}  // namespace

std::optional<std::string> UnmetExpectation(const Config& config, const ProbeAnswer& a, const ProbeAnswer& b) {
  const Config::Probe& p = config.probe;
  if (p.kind != ProbeKind::kSemantic) return std::nullopt;
  if (!Complete(a, p.max_tokens) || !Complete(b, p.max_tokens) || !(a == b)) return std::nullopt;
  if (std::set<int64_t>(a.token_ids.begin(), a.token_ids.end()).size() < 2) return std::nullopt;
  // Wrong answers only: the probe judged them against the expectation.
  const bool ids = p.expect_token_ids.has_value();
  if (ids ? a.token_ids == *p.expect_token_ids : a.text == p.expect.value_or("")) return std::nullopt;
  const std::string key = ids ? "probe.expect_token_ids" : "probe.expect";
  auto where = config.where.find(key);
  const std::string at = where == config.where.end() ? config.path + ":1:1" : where->second;
  const std::string got = ids ? Ids(a.token_ids) : Quoted(a.text) + " (token ids " + Ids(a.token_ids) + ")";
  const std::string want = ids ? Ids(*p.expect_token_ids) : Quoted(p.expect.value_or(""));
  return at + ": " + key + ": both engines answer the probe's prompt with " + got + " (finish_reason " +
         a.finish_reason + "), where " + key + " is " + want +
         ": the model does not produce this answer, so no engine can ever pass its probe; set " + key.substr(6) +
         " to the model's greedy answer to probe.prompt (max_tokens " + std::to_string(p.max_tokens) +
         "), or, if the checkpoint is damaged, restore it";
}

}  // namespace wsup
