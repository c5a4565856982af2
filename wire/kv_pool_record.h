// KvPoolRecord: the node's KV pool (wire/kv_pool.h) as the supervisor's
// keeper hands it to a holder restarted after a crash, so that the new
// holder serves the same memory under the same id instead of making a new
// pool (the KV an engine wrote survives, and no allocation that could fail
// is made). The pool's memory travels beside it as fds the new holder
// inherits, one per allocation in allocation order; the record names their
// numbers.
//
// The file (<runtime_dir>/holder-RANK.kvpool.json), written by the
// supervisor right before it starts a holder with --adopt-kv-pool:
//   {"format": "wsup-kv-pool-record", "version": 1,
//    "pool": {id, backend, device, device_uuid, allocations: [bytes, ...]},
//    "fds": [3, 4, ...]}
// `pool` is checked as a `kv_pool` reply is (DecodeKvPool); `fds` holds one
// inherited fd number (3 or more, none twice) per allocation. Whether the
// fds are what the record says (memfds of those sizes, sealed against
// resizing and not against writing; VMM memory on the named GPU) is the
// adopting holder's check (holder/kv_pool.h).
//
// A record that is refused still says which fds it named when it can be
// read as JSON at all (KvPoolRecordNamedFds), so that the holder closes
// them instead of holding the old pool's memory for nothing.
//
// Thread-safety: values and pure functions, apart from the file's I/O.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "wire/kv_pool.h"

namespace wsup {

inline constexpr int kKvPoolRecordVersion = 1;

struct KvPoolRecord {
  KvPoolMsg pool;
  std::vector<int> fds;  // the inherited fd of each allocation, in order
};

nlohmann::json KvPoolRecordToJson(const KvPoolRecord& r);
Result<KvPoolRecord> KvPoolRecordFromJson(const nlohmann::json& j);
// The fd numbers a record names (3 or more), read leniently from whatever
// JSON it holds: what a holder closes when it refuses the record.
std::vector<int> KvPoolRecordNamedFds(const nlohmann::json& j);

// Written atomically, mode 0600.
Status WriteKvPoolRecord(const std::string& path, const KvPoolRecord& r);
// Errors name the path and say what to do.
Result<KvPoolRecord> ReadKvPoolRecord(const std::string& path);
// The fds named by the file at `path`, leniently (none when it is missing
// or no JSON).
std::vector<int> ReadKvPoolRecordNamedFds(const std::string& path);

}  // namespace wsup
