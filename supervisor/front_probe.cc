// FrontProbe (front_probe.h): the semantic probe through the front.
#include "supervisor/front_probe.h"

#include <algorithm>

#include "common/log.h"

namespace wsup {

void FrontProbe::Run(Done done, int attempts) {
  Attempt(std::make_shared<Done>(std::move(done)), std::max(attempts, 1));
}

void FrontProbe::Attempt(const std::shared_ptr<Done>& done, int attempts_left) {
  SemanticProbeSpec spec = hooks_.spec();
  spec.timeout_ms = std::max(spec.timeout_ms, kMinTimeoutMs);
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/v1/completions";
  req.headers.push_back({"Content-Type", "application/json"});
  req.body = SemanticRequestBody(spec);
  req.timeout_ms = spec.timeout_ms + hooks_.queue_ms();
  const int64_t start = clock_.MonotonicMs();
  std::weak_ptr<int> alive = alive_;
  hooks_.send(std::move(req), [this, alive, spec, start, done, attempts_left](const Result<http::HttpResponse>& r) {
    if (alive.expired()) return;
    const ProbeOutcome o = EvaluateCompletion(spec, r, clock_.MonotonicMs() - start);
    if (o.ok) {
      (*done)(true, clock_.WallMs());
      return;
    }
    if (attempts_left <= 1 || hooks_.stopping()) {
      spdlog::warn("probe through the front failed: {}", o.reason);
      (*done)(false, 0);
      return;
    }
    later_.After(kRetryMs, [this, done, attempts_left] { Attempt(done, attempts_left - 1); });
  });
}

}  // namespace wsup
