// Acquiring an engine's weights in one of the three weight-cache modes:
//   daemon: attach to the holder (one per rank); a missing holder or a
//           fingerprint mismatch is fatal, the message lists the fields;
//   client: attach; on a miss or a missing holder load from disk, and say
//           why in the report (shown in /wsup/status);
//   off:    load from disk.
// With layout "engine" (--layout engine), the holder keeps engine-made
// layouts instead (holder --layout engine): each rank attaches the layout
// the reference engine computes from, or, when nobody has committed it,
// publishes it (engine/layout_publish.h); source is then "published" for the
// engine that wrote a rank's layout and "holder" for one that attached.
// The disk load (engine/weights.h) reads the same slices the holder holds
// (checkpoint/sharding.h). With tensor parallelism every rank attaches to its
// own holder socket; in client mode a miss on any rank sends every rank to
// disk, so ranks never mix sources.
//
// Called once at startup, from the startup thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/fingerprint.h"
#include "common/status.h"
#include "engine/weights.h"

namespace wsup::engine {

struct WeightCacheOptions {
  std::string model_dir;
  std::string mode = "off";           // daemon | client | off
  std::vector<std::string> sockets;   // one per rank (daemon, client)
  int tp = 1;
  int ep = 1;  // 1, or tp: each rank's shard holds whole experts (ShardSpec::ep_size)
  // Cuda ordinal of each rank; empty: the CPU (host-backend holders).
  std::vector<int> devices;
  std::string revision;
  int read_threads = 4;
  int timeout_ms = 10'000;
  std::string client_name = "wsup-engine";
  std::string layout = "checkpoint";  // checkpoint | engine
  uint64_t layout_wait_ms = 600'000;  // engine: how long to wait for another engine's commit
};

struct WeightsReport {
  std::string mode;
  std::string layout = "checkpoint";  // "checkpoint" or "engine"
  std::string source;       // "holder", "published" (this engine wrote the layout) or "disk"
  std::string miss_reason;  // client mode that fell back to disk; "" otherwise
  std::vector<FingerprintDiff> diffs;
  double attach_ms = 0;     // connect, handshake and mapping (all ranks)
  double load_ms = 0;       // disk reading (all ranks), and the copy to the GPUs
  uint64_t bytes = 0;       // weight bytes over all ranks
};

// Sockets for `tp` ranks from a comma-separated flag: exactly one path per
// rank, in rank order.
Result<std::vector<std::string>> RankSockets(const std::string& flag, int tp);

// One WeightSource per rank.
Result<std::vector<std::unique_ptr<WeightSource>>> AcquireWeights(const Checkpoint& ckpt,
                                                                  const WeightCacheOptions& opts,
                                                                  WeightsReport* report);

}  // namespace wsup::engine
