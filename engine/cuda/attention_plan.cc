// PlanTcSplit (engine/cuda/kernels.h): host logic only, built with or
// without the CUDA toolkit, so that its tests run everywhere.
#include <algorithm>
#include <cstdint>

#include "engine/cuda/kernels.h"

namespace wsup::engine::cuda {

TcSplit PlanTcSplit(int n_tiles, int64_t q_heads, int64_t max_keys, int sms) {
  TcSplit sp;
  const int64_t blocks = static_cast<int64_t>(n_tiles) * q_heads;
  sp.keys_per_split = (max_keys + kTcKeyTile - 1) / kTcKeyTile * kTcKeyTile;
  if (blocks <= 0 || max_keys <= 0) return sp;
  // Enough blocks for two a multiprocessor, each range at least
  // kTcMinSplitKeys keys (the merge and the partials cost about one range),
  // within the scratch.
  const int64_t want = (2 * static_cast<int64_t>(sms) + blocks - 1) / blocks;
  const int64_t by_keys = max_keys / kTcMinSplitKeys;
  const int64_t by_scratch = kTcMaxPartials / blocks;
  const int64_t splits = std::max<int64_t>(1, std::min({want, by_keys, by_scratch}));
  if (splits == 1) return sp;
  const int64_t tiles_per = ((max_keys + kTcKeyTile - 1) / kTcKeyTile + splits - 1) / splits;
  sp.keys_per_split = tiles_per * kTcKeyTile;
  sp.splits = static_cast<int>((max_keys + sp.keys_per_split - 1) / sp.keys_per_split);
  return sp;
}

}  // namespace wsup::engine::cuda
