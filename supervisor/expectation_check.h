// Whether the config's probe expectation ([probe] expect_token_ids or
// expect) can never be met by this model: then `wsup start` stops the node
// with exit 78 and the expected and actual answers, instead of restarting
// engines that answer wrongly every probe interval for ever.
//
// `wsup check` cannot tell (it runs no model); the engines' first answers
// can, but only when they show that the wrong answer is what the model
// computes and not what a broken engine computes. The two look alike: a
// damaged checkpoint also answers every probe wrongly, with a completion
// that is well-formed. The evidence taken, all of it required:
//   - the node has never been proven on this start (no probe passed, no
//     engine adopted) and no rollout runs: once an engine answered right,
//     a wrong answer is that engine's fault;
//   - both engines answered, each with a complete, well-formed completion
//     (token ids, and a finish reason of "length" with max_tokens tokens,
//     or "stop"): not an error, a timeout or a cut answer;
//   - the two answers are the same: two processes computing the same
//     tokens is the model's answer, not one process's fault;
//   - the answer holds at least two different tokens: weights damaged into
//     NaN or inf make every logit the same and the greedy answer one token
//     repeated (the corrupted-checkpoint node test answers sixteen 0s).
//     Such an answer is left to the usual restarts and their throttle.
// A checkpoint damaged in a way that still yields a varied, repeatable
// answer is then reported as an expectation the model does not meet; the
// message says so and names both fixes.
//
// Pure function; any thread.
#pragma once

#include <optional>
#include <string>

#include "probes/hysteresis.h"
#include "supervisor/config.h"

namespace wsup {

// The located refusal ("FILE:LINE:COL: probe.expect_token_ids: ...") when
// the two engines' wrong answers `a` and `b` show that the model does not
// produce the expected answer; nullopt when they do not show it. The
// caller checks the node-level conditions (never proven, no rollout).
std::optional<std::string> UnmetExpectation(const Config& config, const ProbeAnswer& a, const ProbeAnswer& b);

}  // namespace wsup
