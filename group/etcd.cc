#include "group/etcd.h"

#include <arpa/inet.h>
#include <openssl/evp.h>

#include <utility>

namespace wsup::group {

using nlohmann::json;

namespace {

// The gateway writes 64-bit numbers as strings and leaves zero values out.
int64_t Num(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return 0;
  const json& v = j[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    try {
      return std::stoll(v.get<std::string>());
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

Result<KeyValue> ReadKv(const json& j) {
  KeyValue kv;
  if (!j.is_object()) return Error(Code::kCorrupt, "etcd: a key-value that is not an object");
  WSUP_ASSIGN_OR_RETURN(kv.key, Base64Decode(j.value("key", "")));
  WSUP_ASSIGN_OR_RETURN(kv.value, Base64Decode(j.value("value", "")));
  kv.create_revision = Num(j, "create_revision");
  kv.mod_revision = Num(j, "mod_revision");
  kv.version = Num(j, "version");
  kv.lease = Num(j, "lease");
  return kv;
}

Result<std::vector<KeyValue>> ReadKvs(const json& j) {
  std::vector<KeyValue> out;
  if (!j.contains("kvs")) return out;
  if (!j["kvs"].is_array()) return Error(Code::kCorrupt, "etcd: \"kvs\" is not an array");
  for (const json& e : j["kvs"]) {
    WSUP_ASSIGN_OR_RETURN(KeyValue kv, ReadKv(e));
    out.push_back(std::move(kv));
  }
  return out;
}

// The first key after every key that starts with prefix: etcd's range_end
// for a prefix ("\0" when there is none: every key).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(prefix.back());
    if (c < 0xff) {
      ++c;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

// etcd's own error in an answer (a status other than 200, or "error" in a
// streamed result).
std::string EtcdMessage(const json& j) {
  if (j.is_object()) {
    if (j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
    if (j.contains("error") && j["error"].is_string()) return j["error"].get<std::string>();
    if (j.contains("error") && j["error"].is_object()) return EtcdMessage(j["error"]);
  }
  return j.dump().substr(0, 300);
}

}  // namespace

std::string EtcdEndpoint::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<EtcdEndpoint> ParseEtcdEndpoint(std::string_view url) {
  const std::string allowed = "write http://HOST:PORT with HOST an IP address or localhost, e.g. http://10.0.0.1:2379";
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return InvalidArgument(url.substr(0, 8) == "https://" ? "https is not supported (no TLS client); " + allowed
                                                          : "not an http:// URL; " + allowed);
  }
  std::string_view rest = url.substr(kScheme.size());
  EtcdEndpoint e;
  size_t colon;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return InvalidArgument("an IPv6 address without its ']'; " + allowed);
    e.host = std::string(rest.substr(1, close - 1));
    colon = close + 1;
    if (colon >= rest.size() || rest[colon] != ':') return InvalidArgument("no port; " + allowed);
  } else {
    colon = rest.rfind(':');
    if (colon == std::string_view::npos) return InvalidArgument("no port; " + allowed);
    e.host = std::string(rest.substr(0, colon));
  }
  const std::string_view port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos) {
    return InvalidArgument("the port is not a number (a path after it is not allowed either); " + allowed);
  }
  e.port = std::stoi(std::string(port));
  if (e.port < 1 || e.port > 65535) return InvalidArgument("port " + std::string(port) + " is out of range; " + allowed);
  unsigned char buf[16];
  const bool literal = ::inet_pton(AF_INET, e.host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, e.host.c_str(), buf) == 1;
  if (!literal && e.host != "localhost") {
    return InvalidArgument("host \"" + e.host + "\" is not an IP address (names are not resolved); " + allowed);
  }
  return e;
}

std::string Base64Encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) return Error(Code::kCorrupt, "etcd: base64 of a length that is not a multiple of 4");
  std::string out(3 * (text.size() / 4), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) return Error(Code::kCorrupt, "etcd: bytes that are not base64");
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t pad = 0;
  for (size_t i = text.size(); i > 0 && text[i - 1] == '=' && pad < 2; --i) ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

// One call in flight: where it is in the endpoint list, and why each
// endpoint tried so far did not answer.
struct EtcdClient::Attempt {
  std::string path;
  std::string body;
  Done<json> done;
  size_t tried = 0;
  std::string failures;
};

struct EtcdClient::WatchState {
  std::string key, range_end;
  int64_t start_revision = 0;
  std::function<void(Result<std::vector<WatchEvent>>)> events;
  http::HttpClient::RequestId request = 0;
  std::string pending;  // bytes of a streamed message not ended yet
  bool ended = false;
};

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(uv_loop_t* loop, std::vector<EtcdEndpoint> endpoints,
                                                       int64_t timeout_ms) {
  if (endpoints.empty()) {
    return Error(Code::kInvalidArgument,
                 "etcd: no endpoints to reach etcd at; list them in group.etcd (\"http://IP:PORT\", etcd's client URLs)");
  }
  if (timeout_ms < 1) {
    return Error(Code::kInvalidArgument,
                 "etcd: a timeout of " + std::to_string(timeout_ms) + " ms; give each attempt at least 1 ms");
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(loop, std::move(endpoints), timeout_ms));
}

EtcdClient::EtcdClient(uv_loop_t* loop, std::vector<EtcdEndpoint> endpoints, int64_t timeout_ms)
    : endpoints_(std::move(endpoints)), timeout_ms_(timeout_ms), http_(loop) {}

// http_'s destructor abandons what is in flight without callbacks.
EtcdClient::~EtcdClient() {
  for (auto& [id, w] : watches_) w->ended = true;
}

void EtcdClient::Call(const std::string& path, const json& body, Done<json> done) {
  auto a = std::make_shared<Attempt>();
  a->path = path;
  a->body = body.dump();
  a->done = std::move(done);
  Try(a);
}

void EtcdClient::Try(const std::shared_ptr<Attempt>& a) {
  const size_t n = endpoints_.size();
  const EtcdEndpoint e = endpoints_[(preferred_ + a->tried) % n];
  http::ClientRequest req;
  req.method = "POST";
  req.target = a->path;
  req.headers.push_back({"Content-Type", "application/json"});
  req.body = a->body;
  req.timeout_ms = timeout_ms_;
  req.max_body_bytes = 64 << 20;
  http_.Send(e.host, e.port, std::move(req), [this, a, e, n](Result<http::HttpResponse> r) {
    if (!r.ok()) {
      // Not reached: the next endpoint, each once.
      a->failures += (a->failures.empty() ? "" : "; ") + e.ToString() + ": " + r.error().message();
      if (++a->tried < n) return Try(a);
      return a->done(Error(Code::kUnavailable, "etcd: no endpoint answered " + a->path + " (" + a->failures +
                                                   "); start etcd or check group.etcd"));
    }
    preferred_ = (preferred_ + a->tried) % n;
    json j = json::parse(r->body, nullptr, false);
    if (j.is_discarded()) {
      return a->done(Error(Code::kCorrupt, "etcd " + e.ToString() + " " + a->path + ": an answer that is not JSON (" +
                                               std::to_string(r->status) + " " + r->body.substr(0, 200) + ")"));
    }
    if (r->status != 200) {
      return a->done(Error(Code::kInternal, "etcd " + e.ToString() + " " + a->path + ": " + std::to_string(r->status) +
                                                " " + EtcdMessage(j)));
    }
    a->done(std::move(j));
  });
}

void EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease, Done<int64_t> done) {
  json body = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease) body["lease"] = std::to_string(lease);
  Call("/v3/kv/put", body, [done = std::move(done)](Result<json> r) {
    if (!r.ok()) return done(r.error());
    done(Num((*r)["header"], "revision"));
  });
}

void EtcdClient::Get(const std::string& key, Done<std::optional<KeyValue>> done) {
  Call("/v3/kv/range", {{"key", Base64Encode(key)}}, [done = std::move(done)](Result<json> r) {
    if (!r.ok()) return done(r.error());
    auto kvs = ReadKvs(*r);
    if (!kvs.ok()) return done(kvs.error());
    done(kvs->empty() ? std::nullopt : std::optional<KeyValue>(std::move(kvs->front())));
  });
}

void EtcdClient::GetPrefix(const std::string& prefix, Done<std::vector<KeyValue>> done) {
  ReadPrefix(prefix, [done = std::move(done)](Result<PrefixRead> r) {
    if (!r.ok()) return done(r.error());
    done(std::move(r->kvs));
  });
}

void EtcdClient::ReadPrefix(const std::string& prefix, Done<PrefixRead> done) {
  Call("/v3/kv/range", {{"key", Base64Encode(prefix)}, {"range_end", Base64Encode(PrefixEnd(prefix))}},
       [done = std::move(done)](Result<json> r) {
         if (!r.ok()) return done(r.error());
         auto kvs = ReadKvs(*r);
         if (!kvs.ok()) return done(kvs.error());
         const json& h = (*r)["header"];
         done(PrefixRead{std::move(*kvs), Num(h, "revision")});
       });
}

void EtcdClient::PutIf(const std::string& key, int64_t expect_mod_revision, const std::string& value, int64_t lease,
                       Done<PutIfResult> done) {
  const std::string k = Base64Encode(key);
  json put = {{"key", k}, {"value", Base64Encode(value)}};
  if (lease) put["lease"] = std::to_string(lease);
  json body = {{"compare", json::array({{{"key", k},
                                         {"result", "EQUAL"},
                                         {"target", "MOD"},
                                         {"mod_revision", std::to_string(expect_mod_revision)}}})},
               {"success", json::array({{{"request_put", put}}})},
               {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
  Call("/v3/kv/txn", body, [done = std::move(done)](Result<json> r) {
    if (!r.ok()) return done(r.error());
    PutIfResult out;
    out.succeeded = r->value("succeeded", false);
    out.revision = Num((*r)["header"], "revision");
    if (!out.succeeded && r->contains("responses") && (*r)["responses"].is_array() && !(*r)["responses"].empty()) {
      const json& range = (*r)["responses"][0].value("response_range", json::object());
      auto kvs = ReadKvs(range);
      if (!kvs.ok()) return done(kvs.error());
      if (!kvs->empty()) out.current = std::move(kvs->front());
    }
    done(std::move(out));
  });
}

void EtcdClient::GrantLease(int64_t ttl_s, Done<int64_t> done) {
  Call("/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}}, [done = std::move(done)](Result<json> r) {
    if (!r.ok()) return done(r.error());
    if (r->contains("error") && !(*r)["error"].is_null() && !r->value("error", std::string()).empty()) {
      return done(Error(Code::kInternal, "etcd: lease grant: " + EtcdMessage(*r)));
    }
    const int64_t id = Num(*r, "ID");
    if (id == 0) return done(Error(Code::kCorrupt, "etcd: lease grant answered no ID: " + r->dump().substr(0, 200)));
    done(id);
  });
}

void EtcdClient::KeepAlive(int64_t lease, Done<int64_t> done) {
  // A stream in etcd's API; the gateway answers the one request sent with
  // one message, {"result": {...}}.
  Call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}, [done = std::move(done)](Result<json> r) {
    if (!r.ok()) return done(r.error());
    const json& res = r->contains("result") ? (*r)["result"] : *r;
    if (r->contains("error")) return done(Error(Code::kInternal, "etcd: lease keepalive: " + EtcdMessage(*r)));
    done(Num(res, "TTL"));
  });
}

void EtcdClient::Revoke(int64_t lease, Done<bool> done) {
  Call("/v3/lease/revoke", {{"ID", std::to_string(lease)}}, [done = std::move(done)](const Result<json>& r) {
    if (!r.ok()) return done(r.error());
    done(true);
  });
}

EtcdClient::WatchId EtcdClient::Watch(const std::string& key, bool prefix, int64_t start_revision,
                                      std::function<void(Result<std::vector<WatchEvent>>)> events) {
  auto w = std::make_shared<WatchState>();
  w->key = key;
  w->range_end = prefix ? PrefixEnd(key) : "";
  w->start_revision = start_revision;
  w->events = std::move(events);
  const WatchId id = next_watch_++;
  watches_[id] = w;
  StartWatch(id);
  return id;
}

void EtcdClient::StartWatch(WatchId id) {
  auto w = watches_.at(id);
  json create = {{"key", Base64Encode(w->key)}};
  if (!w->range_end.empty()) create["range_end"] = Base64Encode(w->range_end);
  if (w->start_revision > 0) create["start_revision"] = std::to_string(w->start_revision);
  const EtcdEndpoint e = endpoints_[preferred_ % endpoints_.size()];
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/v3/watch";
  req.headers.push_back({"Content-Type", "application/json"});
  req.body = json{{"create_request", create}}.dump();
  // A watch lasts until cancelled or broken: the exchange's bound is a
  // week, not a call's timeout.
  req.timeout_ms = 7LL * 24 * 3600 * 1000;
  auto end = [this, id, w](Error e) {
    if (w->ended) return;
    w->ended = true;
    auto cb = std::move(w->events);
    watches_.erase(id);
    cb(std::move(e));
  };
  // The gateway streams one JSON message per line.
  req.on_data = [w, end, e](std::string_view data) {
    if (w->ended) return;
    w->pending.append(data);
    for (size_t nl; (nl = w->pending.find('\n')) != std::string::npos;) {
      const std::string line = w->pending.substr(0, nl);
      w->pending.erase(0, nl + 1);
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded()) return end(Error(Code::kCorrupt, "etcd " + e.ToString() + " watch: a message that is not JSON"));
      if (j.contains("error")) return end(Error(Code::kInternal, "etcd " + e.ToString() + " watch: " + EtcdMessage(j)));
      const json& res = j.contains("result") ? j["result"] : j;
      if (res.value("canceled", false)) {
        return end(Error(Code::kUnavailable, "etcd " + e.ToString() + " watch cancelled by etcd: " +
                                                 res.value("cancel_reason", std::string("no reason given")) +
                                                 (Num(res, "compact_revision") ? " (compacted; watch again from a newer revision)" : "")));
      }
      if (!res.contains("events")) continue;  // "created", progress
      std::vector<WatchEvent> batch;
      for (const json& ev : res["events"]) {
        WatchEvent we;
        we.deleted = ev.value("type", std::string("PUT")) == "DELETE";
        auto kv = ReadKv(ev.value("kv", json::object()));
        if (!kv.ok()) return end(kv.error());
        we.kv = std::move(*kv);
        w->start_revision = we.kv.mod_revision + 1;
        batch.push_back(std::move(we));
      }
      if (!batch.empty()) w->events(std::move(batch));
      if (w->ended) return;
    }
  };
  w->request = http_.Send(e.host, e.port, std::move(req), [end, e](Result<http::HttpResponse> r) {
    if (!r.ok()) return end(Error(r.error().code(), "etcd " + e.ToString() + " watch: " + r.error().message()));
    if (r->status != 200) {
      json j = json::parse(r->body, nullptr, false);
      return end(Error(Code::kInternal, "etcd " + e.ToString() + " watch: " + std::to_string(r->status) + " " +
                                            (j.is_discarded() ? r->body.substr(0, 200) : EtcdMessage(j))));
    }
    end(Error(Code::kIo, "etcd " + e.ToString() + " watch: the stream ended; watch again from the last revision + 1"));
  });
}

void EtcdClient::CancelWatch(WatchId id) {
  auto it = watches_.find(id);
  if (it == watches_.end()) return;
  auto w = it->second;
  w->ended = true;
  watches_.erase(it);
  http_.Cancel(w->request);
}

}  // namespace wsup::group
