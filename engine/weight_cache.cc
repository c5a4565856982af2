#include "engine/weight_cache.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "client/client.h"
#include "engine/cuda/cuda_engine.h"
#include "engine/layout_publish.h"

namespace wsup::engine {

namespace {
using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Rank r's slice, as its holder was started (--tp-size/--tp-rank, and
// --ep-size/--ep-rank under expert parallelism): the same spec plans the
// disk load and computes the fingerprint the holder must match.
ShardSpec RankShard(const WeightCacheOptions& opts, int r) {
  return ShardSpec{opts.tp, r, opts.ep, opts.ep > 1 ? r : 0};
}
}  // namespace

Result<std::vector<std::string>> RankSockets(const std::string& flag, int tp) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= flag.size() && !flag.empty()) {
    size_t comma = flag.find(',', pos);
    if (comma == std::string::npos) comma = flag.size();
    std::string s = flag.substr(pos, comma - pos);
    if (s.empty()) return InvalidArgument("--socket '" + flag + "' has an empty path; give one path per rank, comma-separated");
    out.push_back(s);
    pos = comma + 1;
  }
  if (out.size() != static_cast<size_t>(tp)) {
    return InvalidArgument("--socket names " + std::to_string(out.size()) + " holder socket(s) for " + std::to_string(tp) +
                           " tensor-parallel rank(s); give one per rank, comma-separated in rank order");
  }
  return out;
}

namespace {

// Layout "engine": every rank attaches or publishes its layout. A client
// mode miss on any rank leaves *ranks empty (the caller loads every rank
// from disk) with the reason in the report.
Status AcquireEngineLayouts(const Checkpoint& ckpt, const WeightCacheOptions& opts, AttachMode mode,
                            std::vector<std::unique_ptr<WeightSource>>* ranks, WeightsReport* report) {
  if (!opts.devices.empty()) {
    return InvalidArgument("the reference engine publishes and attaches host-memory layouts only (its CUDA path "
                           "computes from the checkpoint's own tensors): use --device cpu with --layout engine, or "
                           "--layout checkpoint on the GPU. A holder of cuda layouts serves engines that publish on "
                           "the GPU themselves (the Python client's torch allocator, or the C ABI)");
  }
  if (opts.sockets.size() != static_cast<size_t>(opts.tp)) {
    return InvalidArgument("weight-cache mode " + opts.mode + " needs one holder socket per rank (" +
                           std::to_string(opts.tp) + "); pass --socket PATH[,PATH...] or use --weight-cache off");
  }
  bool published = false;
  for (int r = 0; r < opts.tp; ++r) {
    ShardSpec shard = RankShard(opts, r);
    WSUP_ASSIGN_OR_RETURN(FingerprintInputs in, LocalFingerprintInputs(opts.model_dir, opts.revision, shard, "host", 0));
    Fingerprint fp = Fingerprint::Compute(ckpt, in);
    AddEngineLayout(&fp, ReferenceLayoutId());
    AttachOptions ao;
    ao.socket_path = opts.sockets[static_cast<size_t>(r)];
    ao.mode = mode;
    ao.client_name = opts.client_name + (opts.tp > 1 ? "/rank" + std::to_string(r) : "");
    ao.timeout_ms = opts.timeout_ms;
    const std::string rank = opts.tp > 1 ? " (rank " + std::to_string(r) + ")" : "";
    auto got = AcquireRankLayout(ckpt, shard, fp, ao, opts.layout_wait_ms, opts.read_threads);
    if (!got.ok()) return got.error().With("weight-cache " + opts.mode + " --layout engine" + rank);
    report->attach_ms += got->attach_ms;
    report->load_ms += got->load_ms;
    if (!got->weights) {
      report->miss_reason = (opts.tp > 1 ? "rank " + std::to_string(r) + ": " : "") + got->miss_reason;
      spdlog::warn("weight cache miss, loading from disk: {}", report->miss_reason);
      ranks->clear();
      return Status::Ok();
    }
    published = published || got->published;
    ranks->push_back(std::move(got->weights));
  }
  report->source = published ? "published" : "holder";
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::unique_ptr<WeightSource>>> AcquireWeights(const Checkpoint& ckpt,
                                                                  const WeightCacheOptions& opts,
                                                                  WeightsReport* report) {
  WSUP_ASSIGN_OR_RETURN(AttachMode mode, ParseAttachMode(opts.mode));
  report->mode = AttachModeName(mode);
  std::vector<std::unique_ptr<WeightSource>> ranks;
  if (!opts.devices.empty() && opts.devices.size() != static_cast<size_t>(opts.tp)) {
    return InvalidArgument("weight cache: " + std::to_string(opts.devices.size()) + " devices for " +
                           std::to_string(opts.tp) + " ranks; give one GPU per rank");
  }
  auto device_of = [&](int r) { return opts.devices.empty() ? -1 : opts.devices[static_cast<size_t>(r)]; };

  auto load_disk = [&]() -> Status {
    auto t0 = Clock::now();
    ranks.clear();
    for (int r = 0; r < opts.tp; ++r) {
      auto w = LoadWeightsFromDisk(ckpt, RankShard(opts, r), opts.read_threads);
      if (!w.ok()) return w.error();
      if (!opts.devices.empty()) {
        w = UploadWeights(std::move(*w), opts.devices[static_cast<size_t>(r)]);
        if (!w.ok()) return w.error();
      }
      ranks.push_back(std::move(*w));
    }
    report->source = "disk";
    report->load_ms = MsSince(t0);
    return Status::Ok();
  };

  report->layout = opts.layout;
  if (mode == AttachMode::kOff) {
    WSUP_RETURN_IF_ERROR(load_disk());
  } else if (opts.layout == "engine") {
    WSUP_RETURN_IF_ERROR(AcquireEngineLayouts(ckpt, opts, mode, &ranks, report));
    if (ranks.empty()) WSUP_RETURN_IF_ERROR(load_disk());
  } else {
    if (opts.sockets.size() != static_cast<size_t>(opts.tp)) {
      return InvalidArgument("weight-cache mode " + opts.mode + " needs one holder socket per rank (" +
                             std::to_string(opts.tp) + "); pass --socket PATH[,PATH...] or use --weight-cache off");
    }
    std::string miss;
    for (int r = 0; r < opts.tp && miss.empty(); ++r) {
      ShardSpec shard = RankShard(opts, r);
      const int dev = device_of(r);
      WSUP_ASSIGN_OR_RETURN(FingerprintInputs in, LocalFingerprintInputs(opts.model_dir, opts.revision, shard,
                                                                         dev < 0 ? "host" : "cuda", std::max(dev, 0)));
      Fingerprint ours = Fingerprint::Compute(ckpt, in);
      AttachOptions ao;
      ao.socket_path = opts.sockets[static_cast<size_t>(r)];
      ao.mode = mode;
      ao.client_name = opts.client_name + (opts.tp > 1 ? "/rank" + std::to_string(r) : "");
      ao.timeout_ms = opts.timeout_ms;
      ao.device = std::max(dev, 0);
      auto res = Attach(ao, ours);
      if (!res.ok()) {
        // Daemon mode: the caller exits with this message.
        std::string rank = opts.tp > 1 ? " (rank " + std::to_string(r) + ")" : "";
        return res.error().With("weight-cache daemon" + rank);
      }
      report->attach_ms += res->outcome.ms;
      if (res->outcome.source != wsup::WeightSource::kHolder) {
        miss = res->outcome.reason;
        if (opts.tp > 1) miss = "rank " + std::to_string(r) + ": " + miss;
        report->diffs = res->outcome.diffs;
        break;
      }
      auto w = WeightsFromAttachment(std::move(res->attachment), std::max(dev, 0));
      if (w.ok()) {
        Status where = CheckWeightsDevice(**w, dev);
        if (!where.ok()) w = where.error();
      }
      if (!w.ok()) {
        if (mode == AttachMode::kDaemon) return w.error().With("weight-cache daemon");
        miss = "holder arena unusable: " + w.error().message();
        break;
      }
      ranks.push_back(std::move(*w));
    }
    if (!miss.empty()) {
      // Client mode only (daemon returned above): every rank goes to disk.
      spdlog::warn("weight cache miss, loading from disk: {}", miss);
      report->miss_reason = miss;
      WSUP_RETURN_IF_ERROR(load_disk());
    } else {
      report->source = "holder";
    }
  }
  for (const auto& w : ranks) report->bytes += w->total_bytes();
  return ranks;
}

}  // namespace wsup::engine
