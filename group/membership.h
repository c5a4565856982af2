// A group member's standing (docs/architecture.md, "Groups"): its own etcd
// lease, and the members it sees. Pure logic with times passed in, so it is
// tested with a fake clock; GroupLink (group/group_link.h) drives it
// against etcd.
//
// Each member holds one lease and keeps one key under it,
// MemberKey(group, index), whose value (EncodeMember) says what the member
// has applied and how its slots stand. A member whose lease lapses (it died,
// or it was cut off from etcd for a TTL) loses its key: to the others its
// ranks are dead.
//
// OwnLease: the member's own view of its lease. Why it counts from the
// send time of the last keepalive etcd answered: etcd renewed the TTL at
// some moment after the request left, so send time + TTL is never later
// than the lease's real expiry in etcd. A member that is cut off from etcd
// therefore stops serving (Valid false) no later than the others see its
// key go, and never two sides serve across a partition. The margin covers
// the two clocks' drift over one TTL.
//
// MemberView: the members' keys from one read of the prefix and the watch
// after it. An event at or below the read's revision is old news and is
// skipped, so a watch restarted from an earlier revision cannot flap a
// member's state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "group/etcd.h"

namespace wsup::group {

// "/wsup/groups/NAME/members/" and that plus the index.
std::string MembersPrefix(const std::string& group);
std::string MemberKey(const std::string& group, int index);

struct MemberRecord {
  int index = -1;
  int64_t epoch = 0;            // the epoch the member has applied (0: none yet)
  std::string primary, standby;  // its slots' states, as `wsup status` names them
  int64_t lease = 0;            // the lease the key is under (from etcd, not stored in the value)
};

std::string EncodeMember(const MemberRecord& r);
// A member key's value; index must agree with the key's. kCorrupt names
// what is wrong.
Result<MemberRecord> DecodeMember(std::string_view value, int key_index, int64_t lease);
// The index a member key names, or nullopt when it is not one of prefix's.
std::optional<int> MemberIndexOf(std::string_view key, std::string_view prefix);

class OwnLease {
 public:
  // ttl_ms: the TTL asked for; margin_ms is taken off every validity.
  OwnLease(int64_t ttl_ms, int64_t margin_ms) : ttl_ms_(ttl_ms), margin_ms_(margin_ms) {}

  // etcd granted lease `id` with ttl_s seconds (it may raise a small TTL)
  // to a request sent at sent_ms.
  void Granted(int64_t id, int64_t sent_ms, int64_t ttl_s);
  // A keepalive sent at sent_ms was answered with ttl_s > 0.
  void Renewed(int64_t sent_ms, int64_t ttl_s);
  // etcd answered that the lease is gone (a keepalive's TTL 0): it expired
  // or was revoked, and the member's key went with it.
  void Lost();

  int64_t id() const { return id_; }
  // Whether the member may serve: a lease that etcd still holds, as far as
  // the member can know at now_ms.
  bool Valid(int64_t now_ms) const { return id_ != 0 && now_ms < valid_until_ms_; }
  int64_t valid_until_ms() const { return valid_until_ms_; }
  // When to send the next keepalive: a third of the TTL after the last
  // one answered, so two can fail before the lease lapses.
  int64_t NextKeepAliveMs() const { return renewed_at_ms_ + ttl_ms_ / 3; }
  int64_t ttl_ms() const { return ttl_ms_; }

 private:
  int64_t ttl_ms_, margin_ms_;
  int64_t id_ = 0;
  int64_t valid_until_ms_ = 0;
  int64_t renewed_at_ms_ = 0;
};

class MemberView {
 public:
  // size: the members the group has (indexes 0 .. size-1).
  explicit MemberView(int size) : records_(static_cast<size_t>(size)) {}

  struct Change {
    int index = -1;
    bool alive = false;  // its key appeared (or changed) / went
  };

  // A read of the prefix at store revision `revision`: the whole set. Gives
  // the members whose standing changed. A value that does not decode is
  // an Error naming the key (and nothing is changed).
  Result<std::vector<Change>> Reset(const std::vector<KeyValue>& kvs, const std::string& prefix, int64_t revision);
  // Watched events, in order, for the same prefix.
  Result<std::vector<Change>> Apply(const std::vector<WatchEvent>& events, const std::string& prefix);

  bool alive(int index) const { return Record(index).has_value(); }
  const std::optional<MemberRecord>& Record(int index) const;
  int size() const { return static_cast<int>(records_.size()); }
  int alive_count() const;
  // The store revision the view is at: watch from the next one.
  int64_t revision() const { return revision_; }

 private:
  std::vector<std::optional<MemberRecord>> records_;
  int64_t revision_ = 0;
};

}  // namespace wsup::group
