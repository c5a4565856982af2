#include "group/group_link.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace wsup::group {

GroupLink::GroupLink(EtcdClient& etcd, TimerSource& timers, const Clock& clock, Options opts, Hooks hooks)
    : etcd_(etcd),
      clock_(clock),
      opts_(std::move(opts)),
      hooks_(std::move(hooks)),
      prefix_(MembersPrefix(opts_.group)),
      lease_(opts_.lease_ttl_ms, opts_.margin_ms),
      view_(opts_.size),
      tick_(timers.Make()),
      grant_retry_(timers.Make()),
      read_retry_(timers.Make()),
      put_retry_(timers.Make()) {
  record_.index = opts_.index;
}

GroupLink::~GroupLink() { Abandon(); }

void GroupLink::Start() {
  if (!stopped_) return;
  stopped_ = false;
  *live_ = false;  // answers to an earlier run are not this run's
  live_ = std::make_shared<bool>(true);
  // A fresh run, as a restarted process: no lease, no key, not valid.
  lease_ = OwnLease(opts_.lease_ttl_ms, opts_.margin_ms);
  key_in_ = false;
  reported_valid_ = false;
  Grant();
  Read();
}

void GroupLink::Abandon() {
  stopped_ = true;
  *live_ = false;
  tick_->Stop();
  grant_retry_->Stop();
  read_retry_->Stop();
  put_retry_->Stop();
  if (watch_) etcd_.CancelWatch(*watch_);
  watch_.reset();
  granting_ = renewing_ = false;
}

void GroupLink::Publish(MemberRecord r) {
  r.index = opts_.index;
  record_ = std::move(r);
  if (!stopped_ && lease_.id() != 0) PutRecord();
}

void GroupLink::Grant() {
  if (granting_) return;
  granting_ = true;
  const int64_t sent = clock_.MonotonicMs();
  // etcd takes whole seconds; the config keeps lease_ttl_ms whole seconds.
  const int64_t ttl_s = std::max<int64_t>(1, opts_.lease_ttl_ms / 1000);
  etcd_.GrantLease(ttl_s, [this, live = live_, sent, ttl_s](Result<int64_t> r) {
    if (!*live) return;
    granting_ = false;
    if (!r.ok()) {
      // etcd not reached: again after a pause; the member is not serving.
      grant_retry_->Start(kRetryMs, [this] { Grant(); });
      return;
    }
    lease_.Granted(*r, sent, ttl_s);
    key_in_ = false;
    PutRecord();
    ArmTick();
  });
}

void GroupLink::PutRecord() {
  const int64_t lease = lease_.id();
  etcd_.Put(MemberKey(opts_.group, opts_.index), EncodeMember(record_), lease,
            [this, live = live_, lease](const Result<int64_t>& r) {
              if (!*live) return;
              if (!r.ok()) {
                // etcd not reached, or the lease is gone there (the next
                // keepalive finds that out and grants another): the record
                // is put again after a pause while the lease is this one.
                put_retry_->Start(kRetryMs, [this, lease] {
                  if (lease == lease_.id()) PutRecord();
                });
                return;
              }
              // The member counts as present once its key is in: only then
              // may it serve.
              if (lease != lease_.id()) return;
              key_in_ = true;
              Refresh();
            });
}

void GroupLink::KeepAlive() {
  if (renewing_ || lease_.id() == 0) return;
  renewing_ = true;
  const int64_t sent = clock_.MonotonicMs();
  const int64_t id = lease_.id();
  etcd_.KeepAlive(id, [this, live = live_, sent, id](Result<int64_t> r) {
    if (!*live) return;
    renewing_ = false;
    if (id != lease_.id()) return;  // an answer about a lease given up
    if (!r.ok()) {
      // Unreachable: the validity runs out by itself; try again after a
      // pause, or at its end if that is sooner.
      const int64_t now = clock_.MonotonicMs();
      const int64_t wait =
          reported_valid_ ? std::clamp<int64_t>(lease_.valid_until_ms() - now, 1, kRetryMs) : kRetryMs;
      tick_->Start(wait, [this] { Tick(); });
      return;
    }
    if (*r <= 0) {
      // Gone in etcd (expired while cut off, or revoked): the key went with
      // it. Rejoin under a new lease.
      lease_.Lost();
      key_in_ = false;
      Refresh();
      Grant();
      return;
    }
    lease_.Renewed(sent, *r);
    Refresh();
    ArmTick();
  });
}

void GroupLink::ArmTick() {
  if (stopped_ || lease_.id() == 0) return;
  const int64_t now = clock_.MonotonicMs();
  int64_t at = lease_.NextKeepAliveMs();
  if (reported_valid_) at = std::min(at, lease_.valid_until_ms());
  tick_->Start(std::max<int64_t>(1, at - now), [this] { Tick(); });
}

void GroupLink::Tick() {
  if (stopped_) return;
  const int64_t now = clock_.MonotonicMs();
  Refresh();
  if (now >= lease_.NextKeepAliveMs()) {
    if (!renewing_) KeepAlive();
    // The answer re-arms; meanwhile (an etcd that does not answer holds a
    // keepalive until its timeout) the validity's end is watched.
    int64_t wait = kRetryMs;
    if (reported_valid_) wait = std::min(wait, lease_.valid_until_ms() - now);
    tick_->Start(std::max<int64_t>(1, wait), [this] { Tick(); });
    return;
  }
  ArmTick();
}

void GroupLink::Refresh() {
  const bool v = key_in_ && lease_.Valid(clock_.MonotonicMs());
  if (v == reported_valid_) return;
  reported_valid_ = v;
  if (hooks_.lease) hooks_.lease(v);
}

void GroupLink::Read() {
  etcd_.ReadPrefix(prefix_, [this, live = live_](Result<EtcdClient::PrefixRead> r) {
    if (!*live) return;
    if (!r.ok()) {
      read_retry_->Start(kRetryMs, [this] { Read(); });
      return;
    }
    auto changes = view_.Reset(r->kvs, prefix_, r->revision);
    if (!changes.ok()) {
      if (hooks_.error) hooks_.error(changes.error());
      read_retry_->Start(kRetryMs, [this] { Read(); });
      return;
    }
    for (const auto& c : *changes) {
      if (c.index != opts_.index && hooks_.member) hooks_.member(c);
    }
    Watch(r->revision + 1);
  });
}

void GroupLink::Watch(int64_t from) {
  if (watch_) etcd_.CancelWatch(*watch_);
  watch_ = etcd_.Watch(prefix_, true, from, [this, live = live_](Result<std::vector<WatchEvent>> r) {
    if (!*live) return;
    if (!r.ok()) {
      // The watch ended: read afresh and watch from there.
      watch_.reset();
      read_retry_->Start(kRetryMs, [this] { Read(); });
      return;
    }
    auto changes = view_.Apply(*r, prefix_);
    if (!changes.ok()) {
      if (hooks_.error) hooks_.error(changes.error());
      return;
    }
    for (const auto& c : *changes) {
      if (c.index != opts_.index && hooks_.member) hooks_.member(c);
    }
  });
}

}  // namespace wsup::group
