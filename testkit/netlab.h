// NetLab: a private network of "nodes" on one machine, for the group tests
// (issue: groups across nodes). Each node is a network namespace with one
// veth link to a bridge, and the bridge sits in a namespace of its own, so
// the host's network namespace is never touched: nothing a test does can
// reach or disturb the machine's real interfaces. Node i has the private
// address 10.213.N.(i + 1)/24, N from the lab's id, reachable only from
// the lab's other nodes.
//
// A partition takes node i's link down (Cut) until Heal; processes run in
// a node through Command(i, argv) ("ip netns exec NS argv...").
//
// Needs `ip` (iproute2) and the right to make namespaces (root, or
// CAP_SYS_ADMIN and CAP_NET_ADMIN): Create says which is missing, so a
// test can skip with that reason. The destructor deletes every namespace
// (and with them the links); names carry the test process's pid, so
// parallel tests never meet, and Sweep() removes a crashed run's leftovers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace wsup::test {

class NetLab {
 public:
  // `nodes` namespaces (1 .. 32) on one bridge.
  static Result<std::unique_ptr<NetLab>> Create(int nodes);
  ~NetLab();
  NetLab(const NetLab&) = delete;
  NetLab& operator=(const NetLab&) = delete;

  int nodes() const { return static_cast<int>(nodes_.size()); }
  const std::string& ns(int i) const { return nodes_[static_cast<size_t>(i)]; }
  // Node i's address on the lab's network (no prefix length).
  std::string addr(int i) const;
  // argv run inside node i's namespace.
  std::vector<std::string> Command(int i, const std::vector<std::string>& argv) const;

  // Node i's link down (a partition from every other node) or up again.
  Status Cut(int i);
  Status Heal(int i);

  // Deletes namespaces a lab of a process that is gone left behind.
  static void Sweep();

 private:
  NetLab(int id, std::string sw) : id_(id), switch_(std::move(sw)) {}
  Status Link(int i, bool up);

  int id_;
  std::string switch_;              // the bridge's namespace
  std::vector<std::string> nodes_;  // node namespaces
};

}  // namespace wsup::test
