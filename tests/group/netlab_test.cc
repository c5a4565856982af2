// testkit/netlab.h: the private network the group tests run nodes on, with a
// real etcd in one node and etcdctl in another.
#include "testkit/netlab.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "testkit/test_util.h"

using namespace std::chrono_literals;
using wsup::test::NetLab;

namespace {

constexpr const char* kEtcdBin = "/usr/bin/etcd";
constexpr const char* kEtcdctl = "/usr/bin/etcdctl";

std::unique_ptr<NetLab> LabOrSkip(int nodes) {
  if (::access(kEtcdBin, X_OK) != 0 || ::access(kEtcdctl, X_OK) != 0) {
    WARN("skipped: etcd or etcdctl is not installed (scripts/setup.sh installs Debian's etcd-server and etcd-client)");
    return nullptr;
  }
  auto lab = NetLab::Create(nodes);
  if (!lab.ok()) {
    WARN("skipped: " << lab.error().message());
    return nullptr;
  }
  return std::move(*lab);
}

bool Listed(const std::string& ns) {
  return wsup::test::Run({"/usr/sbin/ip", "netns", "list"}, 20s).output.find(ns) != std::string::npos;
}

}  // namespace

TEST_CASE("netlab: nodes reach each other over the lab's bridge - a cut node reaches none until healed, and the lab "
          "leaves no namespace behind",
          "[group][netlab]") {
  auto lab = LabOrSkip(2);
  if (!lab) return;
  wsup::test::TempDir dir;
  // etcd in node 0 on the lab's address. A fresh namespace has every port
  // free, so the usual ones are used; its peer port stays on its loopback.
  const std::string url = "http://" + lab->addr(0) + ":2379";
  auto etcd = wsup::test::Child::Start(
      lab->Command(0, {kEtcdBin, "--name", "n0", "--data-dir", dir.Join("etcd"), "--listen-client-urls", url,
                       "--advertise-client-urls", url, "--listen-peer-urls", "http://127.0.0.1:2380",
                       "--initial-advertise-peer-urls", "http://127.0.0.1:2380", "--initial-cluster",
                       "n0=http://127.0.0.1:2380", "--log-level", "warn"}),
      dir.Join("etcd.log"));
  auto ctl = [&](int node, std::vector<std::string> args) {
    std::vector<std::string> argv = {kEtcdctl, "--endpoints", url, "--dial-timeout", "1s", "--command-timeout", "2s"};
    argv.insert(argv.end(), args.begin(), args.end());
    return wsup::test::Run(lab->Command(node, argv), 15s);
  };
  const bool up = wsup::test::WaitFor([&] { return ctl(1, {"put", "k", "v1"}).exit_code == 0; }, 30s);
  INFO(wsup::test::ReadAll(dir.Join("etcd.log")));
  REQUIRE(up);
  CHECK(ctl(1, {"get", "k", "--print-value-only"}).output == "v1\n");

  // Node 1 cut off: it reaches nothing; node 0 still reaches its own etcd.
  REQUIRE(lab->Cut(1).ok());
  auto cut = ctl(1, {"get", "k"});
  CHECK(cut.exit_code != 0);
  CHECK(ctl(0, {"get", "k", "--print-value-only"}).output == "v1\n");
  REQUIRE(lab->Heal(1).ok());
  CHECK(wsup::test::WaitFor([&] { return ctl(1, {"put", "k", "v2"}).exit_code == 0; }, 20s));
  CHECK(ctl(0, {"get", "k", "--print-value-only"}).output == "v2\n");

  CHECK_FALSE(lab->Cut(5).ok());  // no such node: named, nothing done

  const std::string ns0 = lab->ns(0);
  CHECK(Listed(ns0));
  etcd.Kill(SIGKILL);
  etcd.Wait(10s);
  lab.reset();
  CHECK_FALSE(Listed(ns0));
}

TEST_CASE("netlab: a lab whose test died without cleaning up is swept by the next", "[group][netlab]") {
  auto probe = LabOrSkip(1);
  if (!probe) return;
  probe.reset();
  wsup::test::TempDir dir;
  const std::string name_file = dir.Join("ns");
  // A child process makes a lab and exits without destroying it.
  const int rc = wsup::test::RunForked(
      [&] {
        auto lab = NetLab::Create(1);
        if (!lab.ok()) return 1;
        FILE* f = std::fopen(name_file.c_str(), "w");
        if (!f) return 2;
        std::fputs((*lab)->ns(0).c_str(), f);
        std::fclose(f);
        (void)lab->release();  // leaked on purpose: what a crashed test leaves
        return 0;
      },
      60s);
  REQUIRE(rc == 0);
  const std::string ns = wsup::test::ReadAll(name_file);
  REQUIRE_FALSE(ns.empty());
  CHECK(Listed(ns));
  NetLab::Sweep();
  CHECK_FALSE(Listed(ns));
}
