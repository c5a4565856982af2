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
