// Preflight: what the supervisor checks before it starts any child, so that
// a configuration that cannot work is refused with one clear error (exit
// 78) instead of a crash loop, and a failed start has nothing to undo.
//
// The paths the config names (CheckConfigPaths), the node's own folders,
// and TCP ports. A port another process listens on (another node's
// engine, say) is named with its key and its holder; an engine would only
// fail with "address in use", and worse, whatever listens there would
// answer the supervisor's probes.
//
// Loop thread or any thread: plain functions over the kernel's tables.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "supervisor/config.h"
#include "supervisor/runtime_state.h"

namespace wsup {

struct PortClaim {
  std::string key;   // the config key that names the port, for the message
  std::string host;  // the address the child will bind
  int port = 0;      // nonzero
};

// OK when every claimed port can be bound now, or is in `ours` (ports of
// this node's own live processes, about to be adopted). Otherwise an
// InvalidArgument naming the key, the address, who holds it, and the fix.
Status CheckPortsFree(const std::vector<PortClaim>& claims, const std::vector<int>& ours);

// The engines' configured ports are free, or held by the engines `prev`
// recorded that still run (about to be adopted).
Status CheckEnginePorts(const Config& cfg, const std::optional<RuntimeState>& prev);

// CheckConfigPaths as one InvalidArgument (exit 78) naming every problem;
// `holder` is the wsup-holder beside the wsup binary.
Status CheckNodePaths(const Config& cfg, const std::string& holder);

// node.state_dir (and its logs folder) and node.runtime_dir exist and are
// private to this user (mode 0700). A folder that cannot be made is an
// InvalidArgument located at its key.
Status PrepareNodeDirs(const Config& cfg);

// Raises the soft open-file limit to the hard one (engine-made layouts are
// up to 4096 fds each, and a holder restart passes each one twice at once);
// a failure is logged: fewer layouts can be kept across a holder crash.
void RaiseOpenFileLimit();

// Binds and listens on addr (SO_REUSEADDR; close-on-exec), for the front's
// socket that the supervisor keeps. `key` names the config key in errors.
// *bound_port receives the port (the kernel's pick when addr.port is 0).
Result<UniqueFd> BindListenSocket(const ListenAddress& addr, const std::string& key, int* bound_port);

// A free loopback port for an engine whose configured port is 0. The engine
// binds it a moment later; the window is small, and a clash is caught by the
// identity check (the supervisor never takes another process's answer for
// its engine's) and costs a restart.
Result<int> PickFreePort(const std::string& host);

}  // namespace wsup
