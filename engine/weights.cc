#include "engine/weights.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace wsup::engine {

namespace {

constexpr uint64_t kAlign = 64;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class DiskWeights : public WeightSource {
 public:
  const char* source() const override { return "disk"; }
  std::unique_ptr<void, FreeDeleter> memory;
  using WeightSource::Index;
  using WeightSource::tensors_;
};

class ArenaWeights : public WeightSource {
 public:
  const char* source() const override { return "holder"; }
  int device() const override { return device_; }
  int device_ = -1;
  MappedArena arena;
  std::unique_ptr<Attachment> attachment;
  using WeightSource::Index;
  using WeightSource::tensors_;

  // Builds the table from the mapping, without copying a byte.
  Status Build(const MappedArena& a, int device) {
    device_ = a.is_cuda() ? device : -1;
    for (const auto& e : a.manifest().entries) {
      auto dtype = ParseDType(e.dtype);
      if (!dtype.ok()) return dtype.error().With("holder manifest: tensor '" + e.name + "'");
      if (!e.strides.empty()) {
        return Refused("holder manifest: tensor '" + e.name +
                       "' is stored strided; the reference engine reads contiguous tensors only: publish the "
                       "layout from this engine (--layout engine) or serve the checkpoint's own");
      }
      TensorView v = a.Find(e.name);
      if (!v.data) return Internal("holder manifest: tensor '" + e.name + "' is listed but not mapped");
      WeightTensor t;
      t.name = e.name;
      t.dtype = *dtype;
      t.shape = e.shape;
      t.data = v.data;
      t.nbytes = e.nbytes;
      tensors_.push_back(std::move(t));
    }
    Index();
    return Status::Ok();
  }
};

}  // namespace

const WeightTensor* WeightSource::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

uint64_t WeightSource::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.nbytes;
  return n;
}

void WeightSource::Index() {
  by_name_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
}

Result<std::unique_ptr<WeightSource>> LoadWeightsFromDisk(const Checkpoint& ckpt, const ShardSpec& spec,
                                                          int threads) {
  WSUP_ASSIGN_OR_RETURN(std::vector<ShardedTensor> shards, PlanShards(ckpt, spec));
  auto w = std::make_unique<DiskWeights>();
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (const auto& s : shards) {
    offsets.push_back(total);
    total += (s.nbytes + kAlign - 1) / kAlign * kAlign;
  }
  void* mem = std::aligned_alloc(kAlign, std::max<uint64_t>(total, kAlign));
  if (!mem) {
    return Unavailable(ckpt.dir() + ": cannot allocate " + std::to_string(total) +
                       " bytes for the weights; free memory or use a smaller model");
  }
  w->memory.reset(mem);
  auto* base = static_cast<uint8_t*>(mem);
  for (size_t i = 0; i < shards.size(); ++i) {
    WeightTensor t;
    t.name = shards[i].name;
    t.dtype = shards[i].dtype;
    t.shape = shards[i].shape;
    t.data = base + offsets[i];
    t.nbytes = shards[i].nbytes;
    w->tensors_.push_back(std::move(t));
  }

  // Parallel readers; the first error wins and stops the others early.
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first_error;
  auto reader = [&] {
    for (;;) {
      size_t i = next.fetch_add(1);
      if (i >= shards.size()) return;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (!first_error.ok()) return;
      }
      Status st = ReadShard(ckpt, shards[i], base + offsets[i]);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lk(mu);
        if (first_error.ok()) first_error = st;
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  int n = std::max(1, std::min<int>(threads, static_cast<int>(shards.size())));
  for (int i = 1; i < n; ++i) pool.emplace_back(reader);
  reader();
  for (auto& t : pool) t.join();
  if (!first_error.ok()) return first_error.error();
  w->Index();
  return std::unique_ptr<WeightSource>(std::move(w));
}

Result<std::unique_ptr<WeightSource>> WeightsFromArena(MappedArena arena, int device) {
  auto w = std::make_unique<ArenaWeights>();
  w->arena = std::move(arena);
  WSUP_RETURN_IF_ERROR(w->Build(w->arena, device));
  return std::unique_ptr<WeightSource>(std::move(w));
}

Result<std::unique_ptr<WeightSource>> WeightsFromAttachment(std::unique_ptr<Attachment> attachment, int device) {
  if (!attachment) return Internal("WeightsFromAttachment: no attachment");
  auto w = std::make_unique<ArenaWeights>();
  w->attachment = std::move(attachment);
  WSUP_RETURN_IF_ERROR(w->Build(w->attachment->arena(), device));
  return std::unique_ptr<WeightSource>(std::move(w));
}

Status CheckWeightsDevice(const WeightSource& w, int device) {
  if (w.device() == device) return Status::Ok();
  if (device < 0) {
    return Refused("the holder's arena is in GPU memory (backend cuda), but this engine computes on the CPU; "
                   "start the holder with --backend host, or the engine with --device cuda:N");
  }
  if (w.device() < 0) {
    return Refused("the holder's arena is in host memory (backend host), but this engine computes on cuda:" +
                   std::to_string(device) + "; start the holder with --backend cuda, or the engine with --device cpu");
  }
  return Refused("the holder's arena is on cuda:" + std::to_string(w.device()) + " but this rank computes on cuda:" +
                 std::to_string(device) + "; give each rank the holder of its own GPU (--socket in --device order)");
}

}  // namespace wsup::engine
