#include "client/publish.h"

#include <chrono>

#include "gpu/cuda_driver.h"

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
  Forget();
  // Closing the connection without a commit gives the lease up.
  channel_.Close();
}

void Publication::Forget() {
  // Other owners of the mapping (a committed Attachment, a torch allocator
  // with blocks in it) keep it; otherwise it is unmapped here.
  mapping_.reset();
  regions_.clear();
  fds_.clear();
}

Status Publication::Unpark() {
  if (!mapping_ || mapping_->is_cuda()) return Status::Ok();
  for (size_t i = 0; i < fds_.size(); ++i) {
    Status st = mapping_->MapWritable(i, fds_[i].get());
    if (!st.ok()) return st.error().With(channel_.socket_path());
  }
  return Status::Ok();
}

Result<Publication::Region> Publication::Allocate(uint64_t bytes) {
  if (done_) return Internal("Publication::Allocate after the commit or abort");
  const auto t0 = Clock::now();
  struct AddTime {
    double* total;
    Clock::time_point t0;
    ~AddTime() { *total += MsSince(t0); }
  } add_time{&grant_ms_, t0};
  const bool cuda = lease_.backend == "cuda";
  const char* handle = cuda ? "cuda_vmm" : "memfd";
  if (!mapping_) {
    auto m = GrantMapping::Create(lease_.backend, opts_.device, lease_.device_uuid);
    if (!m.ok()) {
      return m.error().With(channel_.socket_path() + ": the lease is for " + lease_.backend + " memory" +
                            (cuda ? " on " + lease_.device_uuid : std::string()));
    }
    mapping_ = std::move(m).value();
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
  if (reply.fds.size() != 1 || grant->alloc != regions_.size() || grant->size < bytes || grant->handle != handle) {
    return Corrupt(channel_.socket_path() + ": a grant of allocation " + std::to_string(grant->alloc) + " (" +
                   std::to_string(grant->size) + " bytes, handle " + grant->handle + ", " +
                   std::to_string(reply.fds.size()) + " fds) does not answer a request for " +
                   std::to_string(bytes) + " bytes of " + handle + " memory as allocation " +
                   std::to_string(regions_.size()) + "; restart the holder");
  }
  auto data = mapping_->Map(reply.fds[0].get(), grant->size);
  if (!data.ok()) return data.error().With(channel_.socket_path());
  Region r;
  r.alloc = grant->alloc;
  r.size = grant->size;
  r.data = *data;
  regions_.push_back(r);
  fds_.push_back(std::move(reply.fds[0]));
  return r;
}

Status Publication::Locate(const void* p, uint32_t* alloc, uint64_t* offset) const {
  if (mapping_ && mapping_->Locate(p, alloc, offset)) return Status::Ok();
  return NotFound("the address is in none of the lease's " + std::to_string(regions_.size()) +
                  " grants: it was not allocated from this publication");
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
  if (mapping_) {
    if (mapping_->is_cuda()) {
      // The holder checks bytes nowhere, but readers map them at once:
      // every write the writer queued must have landed.
      WSUP_ASSIGN_OR_RETURN(cuda::PrimaryContext ctx, cuda::PrimaryContext::Retain(mapping_->device()));
      cuda::ContextScope scope;
      WSUP_RETURN_IF_ERROR(scope.Enter(ctx));
      WSUP_RETURN_IF_ERROR(cuda::ContextSynchronize());
    } else {
      // F_SEAL_WRITE fails while any writable mapping exists: ours go first.
      Status parked = mapping_->Park();
      if (!parked.ok()) {
        Status back = Unpark();
        if (!back.ok()) return back.error().With(parked.error().message());
        return parked.error();
      }
    }
  }
  auto reply = channel_.Call(msg, opts_.timeout_ms, std::make_shared<const std::string>(std::move(table)));
  if (!reply.ok()) {
    Status back = Unpark();
    if (!back.ok()) return back.error().With(reply.error().message());
    return reply.error();
  }
  if (reply->type() == "error") {
    WSUP_ASSIGN_OR_RETURN(ErrorMsg em, DecodeError(reply->msg));
    Error e = ErrorFromReply(em, channel_.socket_path());
    // The lease is kept: the regions come back where they were, for a fix.
    Status again = Unpark();
    if (!again.ok()) return again.error().With(e.message());
    return e;
  }
  AttachOptions ao = opts_;
  ao.mode = AttachMode::kDaemon;  // a commit that attaches nothing is an error, whatever the mode
  done_ = true;
  std::shared_ptr<GrantMapping> writer = mapping_;
  Forget();
  WSUP_ASSIGN_OR_RETURN(AttachResult r, AttachFromReply(ao, fp_, std::move(channel_), std::move(reply).value(), t0,
                                                        AttachPhases{}, std::move(writer)));
  r.outcome.source = WeightSource::kPublished;
  r.outcome.reason.clear();
  r.outcome.ms = MsSince(t0);
  return r;
}

Status Publication::Abort(const std::string& reason) {
  if (done_) return Status::Ok();
  done_ = true;
  Forget();
  const std::string path = channel_.socket_path();
  auto reply = channel_.Call(EncodeAbort(AbortMsg{reason}), opts_.timeout_ms);
  channel_.Close();
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
