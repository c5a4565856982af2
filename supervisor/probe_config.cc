#include "supervisor/probe_config.h"

#include <utility>
#include <vector>

namespace wsup {

std::unique_ptr<Probe> MakeProbeFromConfig(const Config& config, int port, const std::string& control_token,
                                           http::HttpClient& client, const Clock& clock) {
  ProbeTarget target{config.engine.host, port, control_token};
  const auto& p = config.probe;
  if (p.kind == ProbeKind::kPort) return MakePortProbe(client.loop(), target, p.timeout_ms, clock);
  auto semantic = MakeSemanticProbe(client, target, SemanticSpecFromConfig(config), clock);
  if (!p.comm) return semantic;
  std::vector<std::unique_ptr<Probe>> both;
  both.push_back(std::move(semantic));
  both.push_back(MakeCommProbe(client, target, CommProbeSpec{p.timeout_ms, p.comm_max_age_ms}, clock));
  return MakeAllOfProbe(std::move(both));
}

SemanticProbeSpec SemanticSpecFromConfig(const Config& config) {
  const auto& p = config.probe;
  SemanticProbeSpec spec;
  spec.prompt = p.prompt;
  spec.expect = p.expect;
  spec.expect_token_ids = p.expect_token_ids;
  spec.max_tokens = p.max_tokens;
  spec.timeout_ms = p.timeout_ms;
  return spec;
}

HysteresisOptions HysteresisFromConfig(const Config& config, uint64_t seed) {
  HysteresisOptions o;
  o.failures = config.probe.failures;
  o.successes = config.probe.successes;
  o.interval_ms = config.probe.interval_ms;
  o.jitter_ms = config.probe.jitter_ms;
  o.seed = seed;
  return o;
}

}  // namespace wsup
