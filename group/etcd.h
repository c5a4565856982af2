// EtcdClient: the etcd v3 calls a group of nodes agrees through
// (docs/config.md, [group]), over etcd's JSON gateway (POST /v3/..., keys
// and values in base64, 64-bit numbers as strings), on a libuv loop, so a
// supervisor's loop never blocks on its coordination service.
//
// What the group needs and nothing more: put and get (one key or a
// prefix), a compare-and-put on a key's modification revision (the epoch's
// fencing: two members proposing at once, one wins), leases (grant, keep
// alive, revoke: a member's liveness) and watches (every member learns of a
// change as it is committed).
//
// Endpoints: the cluster's members, tried in order. A call that cannot
// reach one (refused, reset, timed out) goes to the next, each at most once;
// an answer from etcd, even an error, ends the call. So one member down
// costs a failed connect, not the call. Hosts are IP literals or
// "localhost" (http::HttpClient resolves no names); only plain http.
//
// Errors: kUnavailable when no endpoint answered (the message names each
// and why), kCorrupt for an answer that is not etcd's JSON, kInternal for
// etcd's own errors, with its message ("etcdserver: requested lease not
// found"). Every callback runs once, on the loop thread, never inside the
// call that started it.
//
// Ownership: the client owns its http::HttpClient; destroying it abandons
// calls and watches in flight without running their callbacks (run the
// loop afterwards so the handles close). Threads: the loop thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "http/client.h"

namespace wsup::group {

struct EtcdEndpoint {
  std::string host;  // an IP literal (no brackets) or localhost
  int port = 0;
  std::string ToString() const;  // "http://HOST:PORT"
};

// "http://HOST:PORT". The error says what is wrong and what is allowed,
// without a location (the config's loader adds it).
Result<EtcdEndpoint> ParseEtcdEndpoint(std::string_view url);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct WatchEvent {
  bool deleted = false;  // else a put
  KeyValue kv;
};

// base64 (RFC 4648, padded), as etcd's gateway writes bytes.
std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text);

class EtcdClient {
 public:
  template <typename T>
  using Done = std::function<void(Result<T>)>;

  // timeout_ms bounds each attempt at one endpoint. Refuses no endpoints
  // (every call would have nowhere to go) and a timeout below 1 ms, each
  // with its fix.
  static Result<std::unique_ptr<EtcdClient>> Create(uv_loop_t* loop, std::vector<EtcdEndpoint> endpoints,
                                                    int64_t timeout_ms = 2000);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Writes key = value (lease 0: none); gives the store's revision after it.
  void Put(const std::string& key, const std::string& value, int64_t lease, Done<int64_t> done);
  // The key, or nullopt when it is absent.
  void Get(const std::string& key, Done<std::optional<KeyValue>> done);
  // Every key that starts with prefix, in key order.
  void GetPrefix(const std::string& prefix, Done<std::vector<KeyValue>> done);
  // The same, with the store's revision the read was taken at: a watch
  // from revision + 1 then misses nothing and repeats nothing.
  struct PrefixRead {
    std::vector<KeyValue> kvs;
    int64_t revision = 0;
  };
  void ReadPrefix(const std::string& prefix, Done<PrefixRead> done);

  // Puts key = value only if the key's mod_revision is still
  // expect_mod_revision (0: only if the key is absent). succeeded false:
  // someone else wrote it first, and `current` is what is there now.
  struct PutIfResult {
    bool succeeded = false;
    int64_t revision = 0;  // the store's revision after the transaction
    std::optional<KeyValue> current;
  };
  void PutIf(const std::string& key, int64_t expect_mod_revision, const std::string& value, int64_t lease,
             Done<PutIfResult> done);

  // A lease of ttl_s seconds (etcd may raise a small TTL to its minimum);
  // gives its id.
  void GrantLease(int64_t ttl_s, Done<int64_t> done);
  // Renews the lease; gives the TTL it has again, 0 when the lease is
  // gone (expired or revoked): its keys are deleted.
  void KeepAlive(int64_t lease, Done<int64_t> done);
  void Revoke(int64_t lease, Done<bool> done);

  // Puts and deletes of key (with prefix: of every key under it) from
  // start_revision on (0: from now), each batch as etcd commits it. An
  // Error ends the watch (the member's connection broke, or etcd compacted
  // start_revision away); watch again from the last revision seen + 1.
  using WatchId = uint64_t;
  WatchId Watch(const std::string& key, bool prefix, int64_t start_revision,
                std::function<void(Result<std::vector<WatchEvent>>)> events);
  // Ends a watch; its callback does not run again.
  void CancelWatch(WatchId id);

  const std::vector<EtcdEndpoint>& endpoints() const { return endpoints_; }

 private:
  struct Attempt;
  struct WatchState;
  // POSTs body to path at endpoint `first`, then each next one that
  // cannot be reached.
  void Call(const std::string& path, const nlohmann::json& body, Done<nlohmann::json> done);
  void Try(const std::shared_ptr<Attempt>& a);
  void StartWatch(WatchId id);

  EtcdClient(uv_loop_t* loop, std::vector<EtcdEndpoint> endpoints, int64_t timeout_ms);

  std::vector<EtcdEndpoint> endpoints_;  // never empty (Create)
  int64_t timeout_ms_;
  size_t preferred_ = 0;  // the endpoint that answered last
  http::HttpClient http_;
  WatchId next_watch_ = 1;
  std::map<WatchId, std::shared_ptr<WatchState>> watches_;
};

}  // namespace wsup::group
