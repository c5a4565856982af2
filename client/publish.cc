#include "client/publish.h"

#include <sys/mman.h>

#include <cerrno>
#include <chrono>

namespace wsup {

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The holder answers a waiting hello by wait_ms; allow the usual timeout on top.
int ReplyTimeoutMs(const AttachOptions& opts, uint64_t wait_ms) {
  uint64_t ms = wait_ms + static_cast<uint64_t>(opts.timeout_ms);
  return ms > 2'000'000'000ull ? 2'000'000'000 : static_cast<int>(ms);
}

}  // namespace

Publication::Publication(AttachOptions opts, Fingerprint fp, Channel channel, LeaseMsg lease)
    : opts_(std::move(opts)), fp_(std::move(fp)), channel_(std::move(channel)), lease_(std::move(lease)) {}

Publication::~Publication() {
  UnmapAll();
  // Closing the connection without a commit gives the lease up.
  channel_.Close();
}

void Publication::UnmapAll() {
  for (Region& r : regions_) {
    if (r.data != nullptr) ::munmap(r.data, r.size);
    r.data = nullptr;
  }
}

Status Publication::MapAll() {
  for (size_t i = 0; i < regions_.size(); ++i) {
    Region& r = regions_[i];
    if (r.data != nullptr) continue;
    void* p = ::mmap(nullptr, r.size, PROT_READ | PROT_WRITE, MAP_SHARED, fds_[i].get(), 0);
    if (p == MAP_FAILED) {
      return ErrnoError(channel_.socket_path() + ": mapping layout allocation " + std::to_string(i) + " (" +
                            std::to_string(r.size) + " bytes) read-write",
                        errno);
    }
    r.data = p;
  }
  return Status::Ok();
}

Result<Publication::Region> Publication::Allocate(uint64_t bytes) {
  if (done_) return Internal("Publication::Allocate after the commit or abort");
  if (lease_.backend != "host") {
    return Unavailable(channel_.socket_path() + ": the lease is for backend " + lease_.backend +
                       "; this client maps host (memfd) grants only in this version");
  }
  WSUP_ASSIGN_OR_RETURN(Frame reply, channel_.Call(EncodeAlloc(AllocMsg{bytes}), opts_.timeout_ms));
  if (reply.type() == "error") {
    WSUP_ASSIGN_OR_RETURN(ErrorMsg m, DecodeError(reply.msg));
    return ErrorFromReply(m, channel_.socket_path());
  }
  if (reply.type() != "grant") {
    return Corrupt(channel_.socket_path() + ": the holder replied '" + reply.type().substr(0, 32) +
                   "' to alloc, expected grant; run the same wsup version on both sides");
  }
  auto grant = DecodeGrant(reply.msg);
  if (!grant.ok()) return grant.error().With(channel_.socket_path());
  if (reply.fds.size() != 1 || grant->alloc != regions_.size() || grant->size < bytes || grant->handle != "memfd") {
    return Corrupt(channel_.socket_path() + ": a grant of allocation " + std::to_string(grant->alloc) + " (" +
                   std::to_string(grant->size) + " bytes, handle " + grant->handle + ", " +
                   std::to_string(reply.fds.size()) + " fds) does not answer a request for " +
                   std::to_string(bytes) + " bytes as allocation " + std::to_string(regions_.size()) +
                   "; restart the holder");
  }
  Region r;
  r.alloc = grant->alloc;
  r.size = grant->size;
  regions_.push_back(r);
  fds_.push_back(std::move(reply.fds[0]));
  Status mapped = MapAll();
  if (!mapped.ok()) return mapped.error();
  return regions_.back();
}

Result<AttachResult> Publication::Commit(std::vector<ManifestEntry> entries) {
  if (done_) return Internal("Publication::Commit after the commit or abort");
  auto t0 = Clock::now();
  Manifest m;
  m.backend = lease_.backend;
  m.device = lease_.device;
  m.device_uuid = lease_.device_uuid;
  for (const Region& r : regions_) m.allocations.push_back(ManifestAllocation{r.size});
  m.entries = std::move(entries);
  WSUP_ASSIGN_OR_RETURN(std::string table, EncodeTensorTable(m.entries));
  const std::string hash = LayoutHash(m.entries);
  nlohmann::json msg = EncodeCommit(hash, ManifestHeaderToJson(m, table.size()));
  // F_SEAL_WRITE fails while any writable mapping exists: ours go first.
  UnmapAll();
  auto reply = channel_.Call(msg, opts_.timeout_ms, std::make_shared<const std::string>(std::move(table)));
  if (!reply.ok()) return reply.error();
  if (reply->type() == "error") {
    WSUP_ASSIGN_OR_RETURN(ErrorMsg em, DecodeError(reply->msg));
    Error e = ErrorFromReply(em, channel_.socket_path());
    // The lease is kept: map the regions again for a fix.
    Status again = MapAll();
    if (!again.ok()) return again.error().With(e.message());
    return e;
  }
  AttachOptions ao = opts_;
  ao.mode = AttachMode::kDaemon;  // a commit that attaches nothing is an error, whatever the mode
  done_ = true;
  fds_.clear();
  regions_.clear();
  WSUP_ASSIGN_OR_RETURN(AttachResult r, AttachFromReply(ao, fp_, std::move(channel_), std::move(reply).value(), t0));
  r.outcome.source = WeightSource::kPublished;
  r.outcome.reason.clear();
  r.outcome.ms = MsSince(t0);
  return r;
}

Status Publication::Abort(const std::string& reason) {
  if (done_) return Status::Ok();
  done_ = true;
  UnmapAll();
  const std::string path = channel_.socket_path();
  auto reply = channel_.Call(EncodeAbort(AbortMsg{reason}), opts_.timeout_ms);
  channel_.Close();
  fds_.clear();
  regions_.clear();
  if (!reply.ok()) return reply.error();
  if (reply->type() == "error") {
    WSUP_ASSIGN_OR_RETURN(ErrorMsg m, DecodeError(reply->msg));
    return ErrorFromReply(m, path);
  }
  if (reply->type() != "aborted") {
    return Corrupt(path + ": the holder replied '" + reply->type().substr(0, 32) +
                   "' to abort, expected aborted; run the same wsup version on both sides");
  }
  return Status::Ok();
}

Result<LayoutResult> AttachOrPublish(const AttachOptions& opts, const Fingerprint& ours, uint64_t wait_ms) {
  auto t0 = Clock::now();
  LayoutResult result;
  if (opts.mode == AttachMode::kOff) {
    result.outcome.reason = "mode off";
    return result;
  }
  if (opts.socket_path.empty()) {
    return InvalidArgument("weight-cache mode " + std::string(AttachModeName(opts.mode)) +
                           " needs the holder's socket path; set it, or use mode off");
  }
  if (!IsEngineLayout(ours)) {
    return InvalidArgument("an engine-made layout's fingerprint must name the engine (AddEngineLayout: layout = "
                           "engine, engine, engine_version, transform)");
  }
  if (wait_ms > kMaxLayoutWaitMs) {
    return InvalidArgument("a layout wait of " + std::to_string(wait_ms) + " ms is more than the " +
                           std::to_string(kMaxLayoutWaitMs) + " ms (an hour) allowed");
  }
  const bool daemon = opts.mode == AttachMode::kDaemon;
  auto to_disk = [&](const std::string& reason) -> Result<LayoutResult> {
    result.outcome.source = WeightSource::kDisk;
    result.outcome.reason = reason;
    result.outcome.ms = MsSince(t0);
    return std::move(result);
  };
  AttachPhases phases;
  auto ch = Channel::Connect(opts.socket_path, opts.timeout_ms);
  phases.connect_ms = MsSince(t0);
  if (!ch.ok()) {
    if (daemon) return ch.error();
    return to_disk("holder unavailable: " + ch.error().message());
  }
  HelloMsg hello;
  hello.client = opts.client_name;
  hello.role = ClientRole::kEngine;
  hello.fingerprint = ours;
  hello.tensor_table = opts.tensor_table ? kTensorTableVersion : 0;
  hello.publish = true;
  hello.wait_ms = wait_ms;
  auto t_hello = Clock::now();
  auto reply = ch->Call(EncodeHello(hello), ReplyTimeoutMs(opts, wait_ms));
  phases.handshake_ms = MsSince(t_hello);
  if (!reply.ok()) {
    if (daemon) return reply.error();
    return to_disk("holder unavailable: " + reply.error().message());
  }
  if (reply->type() == "lease") {
    auto lease = DecodeLease(reply->msg);
    if (!lease.ok()) {
      Error e = lease.error().With(opts.socket_path);
      if (daemon) return e;
      return to_disk("holder protocol error: " + e.message());
    }
    auto diffs = ours.Compare(lease->fingerprint);
    if (!diffs.empty()) {
      Error e = Mismatch(opts.socket_path + ": the holder leased a layout for another fingerprint (" +
                         Fingerprint::DescribeDiffs(diffs) + "); this is a holder bug: restart the holder");
      if (daemon) return e;
      return to_disk(e.message());
    }
    result.outcome.source = WeightSource::kDisk;
    result.outcome.reason = "no layout committed for this fingerprint: this client publishes it";
    result.outcome.phases = phases;
    result.outcome.ms = MsSince(t0);
    result.publication =
        std::make_unique<Publication>(opts, ours, std::move(ch).value(), std::move(lease).value());
    return result;
  }
  WSUP_ASSIGN_OR_RETURN(AttachResult r,
                        AttachFromReply(opts, ours, std::move(ch).value(), std::move(reply).value(), t0, phases));
  result.outcome = std::move(r.outcome);
  result.attachment = std::move(r.attachment);
  return result;
}

}  // namespace wsup
