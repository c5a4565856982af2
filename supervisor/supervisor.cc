// The supervisor's public face over its node (node.h), and the restart
// policies of its children.
#include "supervisor/supervisor.h"

#include "supervisor/node.h"

namespace wsup {

std::string HostPortString(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

RestartPolicy HolderRestartPolicy(const Config& cfg) {
  RestartPolicy p = EngineRestartPolicy(cfg);
  // The holder refuses a checkpoint it cannot serve (3), bad flags (2) and
  // a configuration that cannot work (78): the same command fails again.
  p.permanent_exit_codes = {kExitUsage, kExitRefused, kExitConfig};
  return p;
}

RestartPolicy FrontRestartPolicy(const Config& cfg) {
  RestartPolicy p = EngineRestartPolicy(cfg);
  // Nothing is served without a front: a crash loop is throttled and
  // reported, never left down, unless the front says its configuration
  // cannot work.
  p.give_up = false;
  p.permanent_exit_codes = {kExitUsage, kExitConfig};
  return p;
}

Supervisor::Supervisor(std::unique_ptr<Node> node) : node_(std::move(node)) {}
Supervisor::~Supervisor() = default;

Result<std::unique_ptr<Supervisor>> Supervisor::Create(Config config, SupervisorOptions options) {
  if (config.group.enabled()) {
    // Checked by wsup check; run by a later supervisor. Running one member
    // as if it were alone would serve beside the others' sides.
    auto it = config.where.find("group.name");
    return InvalidArgument((it != config.where.end() ? it->second : config.path + ":1:1") +
                           ": group: this supervisor runs a node on its own and cannot run a member of a group "
                           "yet; remove [group] to run this node alone (wsup check still checks a group's configs)");
  }
  auto node = std::make_unique<Node>(std::move(config), std::move(options));
  Status st = node->Start();
  if (!st.ok()) return st.error();
  return std::unique_ptr<Supervisor>(new Supervisor(std::move(node)));
}

int Supervisor::Run() { return node_->Run(); }
bool Supervisor::Step() { return node_->Step(); }
int Supervisor::ExitCode() const { return node_->ExitCode(); }
std::string Supervisor::StatusJson() const { return node_->StatusText(); }

}  // namespace wsup
