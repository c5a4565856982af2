// HolderServer's requests (holder/server.h): what each message a client
// sends gets, for a holder of a checkpoint's arena: hello (attach, after the
// fingerprint check), info, kv_pool and bye. Engine-made layouts' requests
// go on to server_layouts.cc; sockets, limits and connections are server.cc.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "holder/server.h"
#include "holder/server_conn.h"

namespace wsup {

using nlohmann::json;

void HolderServer::Handle(Conn* c, const Frame& frame) {
  c->restart_deadline = true;  // every request starts the connection's clock again
  std::string type = frame.type();
  if (c->waiting != 0) {
    Error e = Corrupt("a '" + type.substr(0, 64) + "' request while this connection waits for a layout's commit; "
                      "wait for the answer to 'hello', or open another connection");
    Drop(c, "sent a request while it waited for layout " + std::to_string(c->waiting), &e);
    return;
  }
  if (!frame.blob.empty() && type != "commit") {
    Error e = Corrupt("a '" + type.substr(0, 64) + "' message with a binary part; only 'commit' carries one");
    Drop(c, "sent a binary part with '" + type.substr(0, 64) + "'", &e);
    return;
  }
  if (type == "hello") {
    if (c->greeted) {
      Error e = Corrupt("a second 'hello' on one connection; open a new connection to attach again");
      Drop(c, "sent a second hello", &e);
      return;
    }
    HandleHello(c, frame);
    return;
  }
  if (type == "info") {
    if (!c->greeted) {
      c->greeted = true;
      c->role = "info";
    }
    Reply(c, EncodeInfo(Info()));
    return;
  }
  if (type == "kv_pool") {
    HandleKvPool(c);
    return;
  }
  if (type == "bye") {
    spdlog::debug("{}: said bye", Describe(c));
    CloseConn(c);
    return;
  }
  if (layouts_ != nullptr && (type == "alloc" || type == "commit" || type == "abort")) {
    HandleLayoutRequest(c, type, frame);
    return;
  }
  if (layouts_ != nullptr && type == "keep") {
    HandleKeep(c, frame);
    return;
  }
  std::string shown = type.empty() ? "(none)" : "'" + type.substr(0, 64) + "'";
  Error e = Corrupt(
      "unknown message type " + shown + "; expected hello, info, kv_pool or bye" +
      (layouts_ != nullptr ? ", or alloc, commit or abort under a write lease, or keep from a keeper" : ""));
  Drop(c, "sent a message of unknown type " + shown, &e);
}

void HolderServer::HandleHello(Conn* c, const Frame& frame) {
  auto hello = DecodeHello(frame.msg);
  if (!hello.ok()) {
    Drop(c, "sent a bad hello: " + hello.error().message(), &hello.error());
    return;
  }
  c->greeted = true;
  c->name = hello->client;
  c->role = ClientRoleName(hello->role);
  auto finish_with = [&](json reply) {
    Reply(c, std::move(reply));
    if (c->closing) return;
    c->close_after_flush = true;  // the reply deadline bounds how long it may stay unread
  };
  if (hello->version != kProtocolVersion) {
    Error e = Refused("this holder speaks protocol version " + std::to_string(kProtocolVersion) +
                      ", the client " + std::to_string(hello->version) +
                      "; run the same wsup version for the holder and its clients");
    spdlog::warn("{}: {}", Describe(c), e.message());
    finish_with(EncodeError(e));
    return;
  }
  if (layouts_ != nullptr) {
    HandleLayoutHello(c, *hello);
    return;
  }
  std::vector<FingerprintDiff> diffs;
  if (hello->fingerprint) diffs = hello->fingerprint->Compare(fingerprint_);
  if (hello->role == ClientRole::kEngine && !hello->fingerprint) {
    Error e = InvalidArgument("an engine must present the fingerprint of the weights it expects; compute it "
                              "from its checkpoint (Fingerprint::Compute) and send it in 'hello'");
    spdlog::warn("{}: {}", Describe(c), e.message());
    finish_with(EncodeError(e));
    return;
  }
  if (hello->role != ClientRole::kInspect && !diffs.empty()) {
    std::string described = Fingerprint::DescribeDiffs(diffs);
    spdlog::info("{}: fingerprint mismatch, not attached: {}", Describe(c), described);
    finish_with(EncodeMismatch(MismatchMsg{
        diffs, "the holder's weights differ from the client's in: " + described +
                   "; start a holder for this configuration, or load from disk"}));
    return;
  }
  auto fds = arena_->DupFds();
  if (!fds.ok()) {
    spdlog::error("{}: cannot duplicate the arena fds: {}", Describe(c), fds.error().message());
    finish_with(EncodeError(fds.error()));
    return;
  }
  if (hello->role != ClientRole::kInspect) diffs.clear();
  size_t nfds = fds->size();
  // A client that reads the binary tensor table gets the entries in it;
  // any other gets them as JSON.
  const bool binary = hello->tensor_table >= kTensorTableVersion;
  if (binary) {
    Reply(c, EncodeAttach(table_manifest_, fingerprint_, diffs), std::move(fds).value(), table_);
  } else {
    Reply(c, EncodeAttach(ManifestToJson(arena_->manifest()), fingerprint_, diffs), std::move(fds).value());
  }
  if (c->closing) return;
  c->attached = true;
  c->spared = hello->role == ClientRole::kKeeper;
  ++attaches_;
  spdlog::info("attached {}: {} allocations, {} tensors ({}){}", Describe(c), nfds,
               arena_->manifest().entries.size(), binary ? "tensor table" : "JSON entries",
               diffs.empty()
                   ? ""
                   : " (inspection; fingerprint differs in " + std::to_string(diffs.size()) + " fields)");
}

void HolderServer::HandleKvPool(Conn* c) {
  if (!c->greeted) {
    c->greeted = true;
    c->role = "kv_pool";
  }
  if (kv_pool_ == nullptr) {
    Reply(c, EncodeError(NotFound("this holder has no KV pool; start it with --kv-pool-mib N (the supervisor "
                                  "does when [kv] pool_mib is set)")));
    return;
  }
  auto fds = kv_pool_->DupFds();
  if (!fds.ok()) {
    spdlog::error("{}: cannot duplicate the KV pool's fds: {}", Describe(c), fds.error().message());
    Reply(c, EncodeError(fds.error()));
    return;
  }
  Reply(c, EncodeKvPool(kv_pool_->msg), std::move(fds).value());
  spdlog::debug("{}: sent KV pool {} ({} allocations)", Describe(c), kv_pool_->msg.id, kv_pool_->fds.size());
}

InfoMsg HolderServer::Info() const {
  InfoMsg m;
  m.fingerprint = fingerprint_;
  if (arena_ != nullptr) {
    const Manifest& man = arena_->manifest();
    m.tensors = man.entries.size();
    m.bytes = man.total_bytes();
    m.arena_bytes = man.arena_bytes();
    m.allocations = man.allocations.size();
    m.backend = man.backend;
    m.device = man.device;
    m.device_uuid = man.device_uuid;
  } else {
    m.layout = "engine";
    m.layouts = layouts_->Info(uv_now(loop_));
    for (const LayoutInfo& l : m.layouts) {
      m.tensors += l.tensors;
      if (l.state == "committed") m.bytes += l.bytes;
      m.arena_bytes += l.arena_bytes;
      m.allocations += l.allocations;
    }
    m.backend = layouts_->memory().backend();
    m.device = layouts_->memory().device();
    m.device_uuid = layouts_->memory().device_uuid();
    m.layout_max_bytes = layouts_->max_bytes();
    m.layout_bytes = layouts_->granted_bytes();
  }
  if (kv_pool_ != nullptr) m.kv_pool = kv_pool_->Info();
  m.deployment = opts_.deployment;
  m.revision = opts_.revision;
  m.adopted = opts_.adopted;
  m.holder_pid = ::getpid();
  m.socket = opts_.socket_path;
  m.connections = conns_.size();
  m.max_connections = opts_.max_connections;
  m.idle_timeout_ms = static_cast<uint64_t>(opts_.idle_timeout_ms);
  m.attaches = attaches_;
  m.closed_idle = closed_idle_;
  m.evicted = evicted_;
  for (const auto& [id, c] : conns_) {
    if (c->attached) ++m.clients;
    if (!c->attached && c->name.empty()) continue;  // anonymous: counted in connections only
    if (m.client_list.size() >= kMaxListedClients) {
      ++m.clients_unlisted;
      continue;
    }
    m.client_list.push_back(ClientEntry{c->name, c->role, c->pid, c->uid, c->attached});
  }
  return m;
}

}  // namespace wsup
