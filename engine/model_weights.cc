// A rank's model over its bound weights (BindWeights: model_bind.cc) and
// its CPU KV cache (engine/model.h).
#include <algorithm>
#include <string>

#include "engine/model.h"

namespace wsup::engine {

uint64_t KvStorage::BlockBytes(const ModelDims& d, int block_size) {
  return static_cast<uint64_t>(d.layers) * 2 * static_cast<uint64_t>(d.local_kv_heads) *
         static_cast<uint64_t>(block_size) * static_cast<uint64_t>(d.kv_dim) * sizeof(float);
}

Status KvStorage::Allocate(const ModelDims& d, const KvLayout& layout) {
  if (layout.id_count() <= 0 || layout.block_size <= 0) return InvalidArgument("KV cache: no blocks to allocate");
  layers_ = static_cast<size_t>(d.layers);
  heads_ = static_cast<size_t>(d.local_kv_heads);
  head_dim_ = static_cast<size_t>(d.kv_dim);
  block_size_ = layout.block_size;
  data_ = nullptr;
  mem_.reset();
  WSUP_ASSIGN_OR_RETURN(mem_, KvMemory::CreateHost(layout));
  data_ = reinterpret_cast<float*>(mem_->base());
  return Status::Ok();
}

Result<std::unique_ptr<RankModel>> RankModel::Bind(const ModelDims& d, const WeightSource& w, int threads) {
  if (w.device() >= 0) {
    return Refused("weights are in GPU memory (cuda:" + std::to_string(w.device()) +
                   ") but this rank computes on the CPU; use --device cuda:N or a host-backend holder");
  }
  WSUP_ASSIGN_OR_RETURN(ModelWeights mw, BindWeights(d, w));
  std::unique_ptr<RankModel> m(new RankModel(d, threads));
  m->embed_ = mw.embed;
  m->lm_head_ = mw.lm_head;
  m->final_norm_ = mw.final_norm;
  m->layers_ = std::move(mw.layers);
  m->inv_freq_ = RopeInvFreq(d.head_dim, d.theta);
  return m;
}

}  // namespace wsup::engine
