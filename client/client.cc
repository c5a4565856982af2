#include "client/client.h"

#include <algorithm>
#include <chrono>

#include "common/enum_names.h"
#include "gpu/cuda_driver.h"
#include "wire/layout_protocol.h"

namespace wsup {

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Sends hello and waits for the reply on a fresh connection.
// wait_ms: how long a holder of engine-made layouts may hold the reply
// back for a layout being written (the reply's bound grows by as much).
Result<Frame> Hello(Channel& ch, const std::string& client_name, ClientRole role, const Fingerprint* fp,
                    int timeout_ms, bool tensor_table = true, uint64_t wait_ms = 0) {
  HelloMsg hello;
  hello.client = client_name;
  hello.role = role;
  hello.tensor_table = tensor_table ? kTensorTableVersion : 0;
  hello.wait_ms = wait_ms;
  if (fp != nullptr) hello.fingerprint = *fp;
  const uint64_t bound = static_cast<uint64_t>(timeout_ms) + wait_ms;
  return ch.Call(EncodeHello(hello), bound > 2'000'000'000ull ? 2'000'000'000 : static_cast<int>(bound));
}

Error UnexpectedReply(const std::string& socket_path, const Frame& f, const char* wanted) {
  std::string type = f.type();
  return Corrupt(socket_path + ": the holder replied '" + (type.empty() ? "(no type)" : type.substr(0, 64)) +
                 "' where " + wanted +
                 " was expected; run the same wsup version for the holder and its clients");
}

// The local ordinal of the device an arena lives on (cuda), so that an
// inspector maps it where it is.
int DeviceForManifest(const Manifest& m) {
  if (m.backend != "cuda" || m.device_uuid.empty()) return 0;
  auto d = cuda::FindDeviceByUuid(m.device_uuid);
  return d.ok() ? *d : (m.device >= 0 ? m.device : 0);
}

// One attach in progress, split over Attach() and AttachFromReply(): the
// result being built, the clock of its phases, and what a failure becomes.
// In daemon mode a failure is the error; in client mode it is "load from
// disk", with the reason and the fingerprint's differences.
class AttachRun {
 public:
  AttachRun(const AttachOptions& opts, Clock::time_point t0)
      : daemon_(opts.mode == AttachMode::kDaemon), t0_(t0), step_(Clock::now()) {}

  bool daemon() const { return daemon_; }
  AttachResult& result() { return result_; }
  AttachPhases& phases() { return result_.outcome.phases; }

  // Stores the milliseconds since the last lap (or the start) in *ms.
  void Lap(double* ms) {
    auto now = Clock::now();
    *ms = std::chrono::duration<double, std::milli>(now - step_).count();
    step_ = now;
  }

  Result<AttachResult> ToDisk(const std::string& reason, std::vector<FingerprintDiff> diffs = {}) {
    result_.outcome.source = WeightSource::kDisk;
    result_.outcome.reason = reason;
    result_.outcome.diffs = std::move(diffs);
    return Finish();
  }

  // Daemon mode: e. Client mode: from disk, the reason `prefix` + e's message.
  Result<AttachResult> Fail(const Error& e, const std::string& prefix = "") {
    if (daemon_) return e;
    return ToDisk(prefix + e.message());
  }

  Result<AttachResult> Finish() {
    result_.outcome.ms = MsSince(t0_);
    return std::move(result_);
  }

 private:
  const bool daemon_;
  const Clock::time_point t0_;
  Clock::time_point step_;
  AttachResult result_;
};

}  // namespace

constexpr EnumNames<AttachMode::kOff> kAttachModeNames{"daemon", "client", "off"};

const char* AttachModeName(AttachMode mode) { return kAttachModeNames(mode, "unknown"); }

Result<AttachMode> ParseAttachMode(std::string_view name) {
  if (auto mode = kAttachModeNames.Parse(name)) return *mode;
  return InvalidArgument("weight-cache mode '" + std::string(name.substr(0, 64)) +
                         "' is not one of daemon, client, off");
}

const char* WeightSourceName(WeightSource source) {
  static constexpr EnumNames<WeightSource::kPublished> kNames{"holder", "disk", "published"};
  return kNames(source, "disk");
}

// ---------------------------------------------------------------- Attachment

Attachment::Attachment(Channel channel, MappedArena arena, Fingerprint holder_fp,
                       std::vector<FingerprintDiff> diffs)
    : channel_(std::move(channel)),
      arena_(std::move(arena)),
      holder_fp_(std::move(holder_fp)),
      diffs_(std::move(diffs)) {}

Attachment::~Attachment() { Detach(); }

void Attachment::Detach() {
  if (detached_) return;
  detached_ = true;
  if (channel_.connected()) {
    // A courtesy: the holder would notice the close anyway.
    (void)channel_.Send(EncodeBye(), {}, 1000);
    channel_.Close();
  }
  arena_ = MappedArena();
}

// ---------------------------------------------------------------- attach

Result<AttachResult> Attach(const AttachOptions& opts, const Fingerprint& ours) {
  auto t0 = Clock::now();
  AttachRun run(opts, t0);
  if (opts.mode == AttachMode::kOff) {
    run.result().outcome.reason = "mode off";
    return run.Finish();
  }
  if (opts.socket_path.empty()) {
    return InvalidArgument("weight-cache mode " + std::string(AttachModeName(opts.mode)) +
                           " needs the holder's socket path; set it, or use mode off");
  }
  AttachPhases& phases = run.phases();
  auto ch = Channel::Connect(opts.socket_path, opts.timeout_ms);
  run.Lap(&phases.connect_ms);
  if (!ch.ok()) return run.Fail(ch.error(), "holder unavailable: ");
  if (opts.layout_wait_ms > kMaxLayoutWaitMs) {
    return InvalidArgument("a layout wait of " + std::to_string(opts.layout_wait_ms) +
                           " ms is more than the " + std::to_string(kMaxLayoutWaitMs) +
                           " ms (an hour) allowed");
  }
  auto reply = Hello(*ch, opts.client_name, ClientRole::kEngine, &ours, opts.timeout_ms, opts.tensor_table,
                     opts.layout_wait_ms);
  run.Lap(&phases.handshake_ms);
  if (!reply.ok()) return run.Fail(reply.error(), "holder unavailable: ");
  return AttachFromReply(opts, ours, std::move(ch).value(), std::move(reply).value(), t0, phases);
}

Result<AttachResult> AttachFromReply(const AttachOptions& opts, const Fingerprint& ours, Channel ch,
                                     Frame reply, std::chrono::steady_clock::time_point t0,
                                     AttachPhases before, std::shared_ptr<GrantMapping> writer) {
  AttachRun run(opts, t0);
  AttachPhases& phases = run.phases();
  phases = before;
  std::string type = reply.type();
  if (type == "mismatch") {
    auto m = DecodeMismatch(reply.msg);
    if (!m.ok())
      return run.daemon() ? Result<AttachResult>(m.error().With(opts.socket_path))
                          : run.ToDisk(m.error().message());
    std::string described = Fingerprint::DescribeDiffs(m->diffs);
    if (run.daemon()) {
      return Mismatch(opts.socket_path + ": the holder's weights differ from this engine's in: " + described +
                      "; start the holder with the same model and deployment settings, or use weight-cache "
                      "mode `client` to load from disk on a mismatch");
    }
    return run.ToDisk("fingerprint mismatch: " + described, std::move(m->diffs));
  }
  if (type == "error") {
    auto m = DecodeError(reply.msg);
    return run.Fail(m.ok() ? ErrorFromReply(*m, opts.socket_path) : m.error().With(opts.socket_path),
                    "holder refused: ");
  }
  if (type != "attach") {
    return run.Fail(UnexpectedReply(opts.socket_path, reply, "attach, mismatch or error"),
                    "holder protocol error: ");
  }
  // Map() decodes the table's entries (while it maps) and validates them.
  auto attach = DecodeAttach(reply.msg, reply.blob, ManifestDecoding::kHeaderOnly);
  run.Lap(&phases.decode_ms);
  if (!attach.ok()) return run.Fail(attach.error().With(opts.socket_path), "holder protocol error: ");
  // The holder compared already; compare again so that a holder bug cannot
  // hand an engine the wrong weights silently.
  auto diffs = ours.Compare(attach->fingerprint);
  if (!diffs.empty()) {
    std::string described = Fingerprint::DescribeDiffs(diffs);
    if (run.daemon()) {
      return Mismatch(opts.socket_path + ": the holder attached weights that differ in: " + described +
                      "; this is a holder bug: restart the holder");
    }
    return run.ToDisk("fingerprint mismatch: " + described, std::move(diffs));
  }
  MapStats map_stats;
  auto mapped = MappedArena::Map(std::move(attach->manifest), std::move(reply.fds), opts.device, &map_stats,
                                 reply.blob, std::move(writer));
  phases.decode_ms += map_stats.decode_ms;
  phases.checks_ms = map_stats.checks_ms;
  phases.index_ms = map_stats.index_ms;
  phases.map_ms = map_stats.map_ms;
  phases.overlapped = map_stats.overlapped;
  if (!mapped.ok())
    return run.Fail(mapped.error().With(opts.socket_path + ": cannot map the holder's arena"));
  run.result().outcome.source = WeightSource::kHolder;
  run.result().attachment =
      std::make_unique<Attachment>(std::move(ch), std::move(mapped).value(), std::move(attach->fingerprint),
                                   std::vector<FingerprintDiff>{});
  return run.Finish();
}

Result<std::unique_ptr<Attachment>> AttachInspect(const std::string& socket_path,
                                                  const std::string& client_name, int timeout_ms,
                                                  const Fingerprint* ours) {
  WSUP_ASSIGN_OR_RETURN(Channel ch, Channel::Connect(socket_path, timeout_ms));
  WSUP_ASSIGN_OR_RETURN(Frame reply, Hello(ch, client_name, ClientRole::kInspect, ours, timeout_ms));
  std::string type = reply.type();
  if (type == "error") {
    WSUP_ASSIGN_OR_RETURN(ErrorMsg m, DecodeError(reply.msg));
    return ErrorFromReply(m, socket_path);
  }
  if (type != "attach") return UnexpectedReply(socket_path, reply, "attach");
  // Map() decodes the table's entries (while it maps) and validates them.
  auto attach = DecodeAttach(reply.msg, reply.blob, ManifestDecoding::kHeaderOnly);
  if (!attach.ok()) return attach.error().With(socket_path);
  int device = DeviceForManifest(attach->manifest);
  auto mapped =
      MappedArena::Map(std::move(attach->manifest), std::move(reply.fds), device, nullptr, reply.blob);
  if (!mapped.ok()) return mapped.error().With(socket_path + ": cannot map the holder's arena");
  return std::make_unique<Attachment>(std::move(ch), std::move(mapped).value(),
                                      std::move(attach->fingerprint), std::move(attach->diffs));
}

Result<KeptArena> AttachKeeper(const std::string& socket_path, const std::string& client_name, int timeout_ms,
                               const Fingerprint* expected) {
  WSUP_ASSIGN_OR_RETURN(Channel ch, Channel::Connect(socket_path, timeout_ms));
  WSUP_ASSIGN_OR_RETURN(Frame reply, Hello(ch, client_name, ClientRole::kKeeper, expected, timeout_ms));
  std::string type = reply.type();
  if (type == "mismatch") {
    WSUP_ASSIGN_OR_RETURN(MismatchMsg m, DecodeMismatch(reply.msg));
    return Mismatch(socket_path + ": the holder's weights differ from the expected ones in: " +
                    Fingerprint::DescribeDiffs(m.diffs) +
                    "; restart the holder with the deployment's settings");
  }
  if (type == "error") {
    WSUP_ASSIGN_OR_RETURN(ErrorMsg m, DecodeError(reply.msg));
    return ErrorFromReply(m, socket_path);
  }
  if (type == "committed") {
    return Refused(socket_path +
                   ": this holder keeps engine-made layouts (--layout engine), not one arena; "
                   "keep its committed layouts one by one (KeepLayouts)");
  }
  if (type != "attach") return UnexpectedReply(socket_path, reply, "attach");
  auto attach = DecodeAttach(reply.msg, reply.blob);
  if (!attach.ok()) return attach.error().With(socket_path);
  if (reply.fds.size() != attach->manifest.allocations.size()) {
    return Corrupt(socket_path + ": the holder sent " + std::to_string(reply.fds.size()) + " fds for " +
                   std::to_string(attach->manifest.allocations.size()) +
                   " allocations; restart the holder and attach again");
  }
  KeptArena kept;
  kept.record.manifest = std::move(attach->manifest);
  kept.record.fingerprint = std::move(attach->fingerprint);
  kept.fds = std::move(reply.fds);
  kept.channel = std::move(ch);
  return kept;
}

Result<LayoutKeepRound> KeepLayouts(const std::string& socket_path, const std::string& client_name,
                                    int timeout_ms, const std::vector<CommittedLayout>& have,
                                    uint64_t max_fds) {
  WSUP_ASSIGN_OR_RETURN(Channel ch, Channel::Connect(socket_path, timeout_ms));
  WSUP_ASSIGN_OR_RETURN(Frame reply, Hello(ch, client_name, ClientRole::kKeeper, nullptr, timeout_ms));
  std::string type = reply.type();
  if (type == "error") {
    WSUP_ASSIGN_OR_RETURN(ErrorMsg m, DecodeError(reply.msg));
    return ErrorFromReply(m, socket_path);
  }
  if (type == "attach") {
    return Refused(socket_path +
                   ": this holder serves a checkpoint arena, not engine-made layouts; keep it "
                   "with AttachKeeper");
  }
  if (type != "committed") return UnexpectedReply(socket_path, reply, "committed");
  auto committed = DecodeCommitted(reply.msg);
  if (!committed.ok()) return committed.error().With(socket_path);
  LayoutKeepRound round;
  round.committed = committed->layouts;
  uint64_t fds_left = max_fds;
  for (const CommittedLayout& c : round.committed) {
    bool kept = std::any_of(have.begin(), have.end(), [&](const CommittedLayout& h) {
      return h.id == c.id && h.layout_hash == c.layout_hash;
    });
    if (kept) continue;
    const std::string named = DescribeLayout(c.id, c.layout_hash);
    if (c.allocations > fds_left) {
      round.skipped.push_back(named + ": its " + std::to_string(c.allocations) + " fds do not fit in the " +
                              std::to_string(fds_left) + " this keeper may still hold");
      continue;
    }
    WSUP_ASSIGN_OR_RETURN(Frame k, ch.Call(EncodeKeep(KeepMsg{c.id}), timeout_ms));
    if (k.type() == "error") {
      auto m = DecodeError(k.msg);
      round.skipped.push_back(named + ": " +
                              (m.ok() ? ErrorFromReply(*m, socket_path).message() : m.error().message()));
      continue;
    }
    if (k.type() != "kept") return UnexpectedReply(socket_path, k, "kept or error");
    auto rec = DecodeKept(k.msg);
    if (!rec.ok()) {
      round.skipped.push_back(named + ": " + rec.error().message());
      continue;
    }
    // Whole or not at all: a record that is not the one listed, or fds
    // that do not match its allocations, are never kept.
    if (rec->id != c.id || rec->layout_hash != c.layout_hash) {
      round.skipped.push_back(named + ": the holder sent " + DescribeLayout(rec->id, rec->layout_hash) +
                              " instead");
      continue;
    }
    if (k.fds.size() != rec->manifest.allocations.size()) {
      round.skipped.push_back(named + ": " + std::to_string(k.fds.size()) + " fds came for " +
                              std::to_string(rec->manifest.allocations.size()) + " allocations");
      continue;
    }
    fds_left -= k.fds.size();
    round.fetched.push_back(KeptLayout{std::move(rec).value(), std::move(k.fds)});
  }
  (void)ch.Send(EncodeBye(), {}, 1000);  // the holder closes it anyway once idle
  return round;
}

Result<InfoMsg> QueryHolderInfo(const std::string& socket_path, int timeout_ms) {
  WSUP_ASSIGN_OR_RETURN(Channel ch, Channel::Connect(socket_path, timeout_ms));
  WSUP_ASSIGN_OR_RETURN(Frame reply, ch.Call(EncodeInfoRequest(), timeout_ms));
  std::string type = reply.type();
  if (type == "error") {
    WSUP_ASSIGN_OR_RETURN(ErrorMsg m, DecodeError(reply.msg));
    return ErrorFromReply(m, socket_path);
  }
  if (type != "info") return UnexpectedReply(socket_path, reply, "info");
  auto info = DecodeInfo(reply.msg);
  if (!info.ok()) return info.error().With(socket_path);
  (void)ch.Send(EncodeBye(), {}, 1000);
  return info;
}

}  // namespace wsup
