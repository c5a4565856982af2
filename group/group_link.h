// One member's link to its group in etcd (docs/architecture.md, "Groups"):
// its lease kept alive, its member key published under it, and the other
// members' keys watched. The decisions are group/membership.h's; this class
// carries them out with an EtcdClient and says what changed.
//
// Lifecycle:
//   Start()    grant a lease, put the member key under it, read the members'
//              prefix, watch it from the read's revision on;
//   a timer    renews the lease a third of a TTL after the last renewal
//              etcd answered, and tells when the lease can no longer be
//              counted on (cut off from etcd for a TTL);
//   lost       etcd answered that the lease is gone: a new one is granted
//              and the key put again (the member rejoins);
//   a watch    that ends (etcd restarted, the connection broke) is started
//              again from a fresh read, after kRetryMs.
// Publish() replaces the member's record; it is put at once when a lease
// is held, else with the next grant; a put that fails is tried again while
// the lease is the same. The lease counts as usable only once the key is in
// under it. Abandon() stops everything without
// revoking the lease: what a crash looks like to the others (tests).
//
// Owns its timers and watch; callbacks never run after destruction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "common/timer.h"
#include "group/etcd.h"
#include "group/membership.h"

namespace wsup::group {

class GroupLink {
 public:
  struct Options {
    std::string group;     // [group] name
    int index = 0;         // this member
    int size = 2;          // the members
    int64_t lease_ttl_ms = 2000;
    int64_t margin_ms = 100;  // taken off the lease's validity (OwnLease)
  };
  struct Hooks {
    // The member's own lease became usable (true) or can no longer be
    // counted on (false): serve only while true.
    std::function<void(bool valid)> lease;
    // Another member's key appeared or went.
    std::function<void(const MemberView::Change&)> member;
    // Something etcd answered that needs a person: a corrupt or stray key.
    std::function<void(const Error&)> error;
  };

  // The pause before another try at an etcd that did not answer.
  static constexpr int64_t kRetryMs = 200;

  GroupLink(EtcdClient& etcd, TimerSource& timers, const Clock& clock, Options opts, Hooks hooks);
  ~GroupLink();
  GroupLink(const GroupLink&) = delete;
  GroupLink& operator=(const GroupLink&) = delete;

  void Start();
  void Publish(MemberRecord r);
  void Abandon();

  const OwnLease& lease() const { return lease_; }
  const MemberView& view() const { return view_; }
  const std::string& prefix() const { return prefix_; }
  // Whether the lease is usable now (OwnLease::Valid at the clock's now).
  bool valid() const { return lease_.Valid(clock_.MonotonicMs()); }

 private:
  void Grant();
  void PutRecord();
  void KeepAlive();
  void Read();
  void Watch(int64_t from);
  void ArmTick();
  void Tick();
  // Reports the lease as usable when the key is in under it and it is
  // valid now, as unusable otherwise (each change once).
  void Refresh();

  EtcdClient& etcd_;
  const Clock& clock_;
  Options opts_;
  Hooks hooks_;
  std::string prefix_;
  OwnLease lease_;
  MemberView view_;
  MemberRecord record_;
  std::unique_ptr<Timer> tick_, grant_retry_, read_retry_, put_retry_;
  std::optional<EtcdClient::WatchId> watch_;
  bool stopped_ = true;
  bool granting_ = false, renewing_ = false;
  bool key_in_ = false;  // the member key was put under the current lease
  bool reported_valid_ = false;
  // Answers in flight hold a copy; a destroyed or abandoned link's answers
  // find it false and do nothing.
  std::shared_ptr<bool> live_ = std::make_shared<bool>(true);
};

}  // namespace wsup::group
