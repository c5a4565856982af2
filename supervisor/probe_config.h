// The probe and the hysteresis that the [probe] section of the config asks
// for, built from the probe library's specs (probes/probe.h). Kept here so
// that probes/ knows nothing of the config and the supervisor owns the
// mapping. Loop thread of `client`, like the probes themselves.
#pragma once

#include <cstdint>
#include <memory>

#include "common/clock.h"
#include "http/client.h"
#include "probes/hysteresis.h"
#include "probes/probe.h"
#include "supervisor/config.h"

namespace wsup {

// The probe [probe] asks for, against the engine on `port`: semantic (plus
// comm when probe.comm is set) or port. `control_token`: the engine's
// (http/control_auth.h), for the comm probe's /wsup/status; "" for none.
std::unique_ptr<Probe> MakeProbeFromConfig(const Config& config, int port, const std::string& control_token,
                                           http::HttpClient& client, const Clock& clock = RealClock());
// The semantic probe's request and expected answer as [probe] gives them
// (also what the node sends through the front, front_probe.h).
SemanticProbeSpec SemanticSpecFromConfig(const Config& config);
// The hysteresis [probe] asks for; `seed` varies the jitter per engine.
HysteresisOptions HysteresisFromConfig(const Config& config, uint64_t seed);

}  // namespace wsup
