#include "engine/runner.h"

#include <algorithm>

#include "engine/cuda/cuda_engine.h"

namespace wsup::engine {

namespace {

// A CPU rank: the reference kernels over host weights, a host KV cache and
// an in-process communicator.
class CpuRank : public RankEngine {
 public:
  explicit CpuRank(std::unique_ptr<RankModel> m) : model_(std::move(m)) {}
  const ModelDims& dims() const override { return model_->dims(); }
  std::string device_name() const override { return "cpu"; }
  uint64_t KvBlockBytes(int block_size) const override { return KvStorage::BlockBytes(dims(), block_size); }
  Status AllocateKv(const KvLayout& layout, int, int) override { return kv_.Allocate(dims(), layout); }
  Status MapKvPool(const std::vector<UniqueFd>& fds) override { return kv_.memory().MapPool(fds); }
  // The CPU computes synchronously: no step is running when this is called.
  Status UnmapKvPool() override { return kv_.memory().UnmapPool(); }
  KvMemory* kv_memory() override { return kv_.allocated() ? &kv_.memory() : nullptr; }
  Status Forward(const StepBatch& batch, std::vector<float>* logits) override {
    if (!comm_) return Internal("Forward() before the communicator exists");
    return model_->Forward(batch, kv_, *comm_, logits);
  }
  Status AllReduceHost(float* v, size_t n) override {
    if (!comm_) return Internal("keepalive before the communicator exists");
    return comm_->AllReduceSum(v, n);
  }
  void SetComm(std::unique_ptr<Communicator> c) { comm_ = std::move(c); }
  const char* comm_kind() const { return comm_ ? comm_->kind() : "none"; }

 private:
  std::unique_ptr<RankModel> model_;
  KvStorage kv_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace

Result<std::unique_ptr<ModelRunner>> ModelRunner::Create(const ModelConfig& cfg,
                                                         std::vector<std::unique_ptr<WeightSource>> weights,
                                                         const RunnerOptions& opts) {
  if (weights.empty()) return InvalidArgument("no weight sources: at least one rank is needed");
  std::unique_ptr<ModelRunner> r(new ModelRunner());
  r->opts_ = opts;
  const int tp = static_cast<int>(weights.size());
  if (!opts.devices.empty() && opts.devices.size() != weights.size()) {
    return InvalidArgument(std::to_string(opts.devices.size()) + " devices for " + std::to_string(tp) +
                           " ranks; give one GPU per rank");
  }
  const int threads = opts.threads_per_rank > 0 ? opts.threads_per_rank : ThreadPool::DefaultThreads(tp);
  for (int rank = 0; rank < tp; ++rank) {
    WSUP_ASSIGN_OR_RETURN(ModelDims dims, ModelDims::From(cfg, tp, rank, opts.ep));
    const WeightSource& w = *weights[static_cast<size_t>(rank)];
    if (opts.devices.empty()) {
      WSUP_ASSIGN_OR_RETURN(auto model, RankModel::Bind(dims, w, threads));
      r->ranks_.push_back(std::make_unique<CpuRank>(std::move(model)));
    } else {
      CudaRankOptions co;
      co.dequant_scratch_bytes = opts.dequant_scratch_bytes;
      co.bf16_activations = opts.bf16_activations;
      co.float32_attention = opts.float32_attention;
      WSUP_ASSIGN_OR_RETURN(auto rank_engine, MakeCudaRank(dims, w, opts.devices[static_cast<size_t>(rank)], co));
      r->ranks_.push_back(std::move(rank_engine));
    }
  }
  r->weights_ = std::move(weights);
  r->rank_logits_.resize(static_cast<size_t>(tp));
  r->results_.resize(static_cast<size_t>(tp));
  for (int rank = 1; rank < tp; ++rank) r->threads_.emplace_back([p = r.get(), rank] { p->RankLoop(rank); });
  return r;
}

ModelRunner::~ModelRunner() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  job_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ModelRunner::RankLoop(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<Status(int)>* job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      job_cv_.wait(lk, [&] { return stop_ || job_gen_ != seen; });
      if (stop_) return;
      seen = job_gen_;
      job = job_;
    }
    Status st = (*job)(rank);
    {
      std::lock_guard<std::mutex> lk(mu_);
      results_[static_cast<size_t>(rank)] = std::move(st);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
}

Status ModelRunner::OnAllRanks(const std::function<Status(int)>& fn) {
  const int n = tp();
  if (n > 1) {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    pending_ = n - 1;
    ++job_gen_;
    job_cv_.notify_all();
  }
  Status first = fn(0);
  if (n > 1) {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
    for (int r = 1; r < n; ++r) {
      if (first.ok() && !results_[static_cast<size_t>(r)].ok()) first = results_[static_cast<size_t>(r)];
    }
  }
  return first;
}

const char* ModelRunner::comm_kind() const {
  if (!comm_ready_) return "none";
  if (on_gpu()) return "nccl";
  return static_cast<const CpuRank*>(ranks_[0].get())->comm_kind();
}

Status ModelRunner::InitCommunicator() {
  if (on_gpu()) {
    std::vector<RankEngine*> raw;
    for (auto& r : ranks_) raw.push_back(r.get());
    // One rank's communicator carries only the keepalive: one channel.
    const int ctas = opts_.nccl_max_ctas > 0 ? opts_.nccl_max_ctas : (tp() == 1 ? 1 : 0);
    WSUP_RETURN_IF_ERROR(InitCudaCommunicators(raw, ctas));
    comm_ready_ = true;
    return Keepalive();
  }
  return InitCommunicator(MakeInProcessGroup(tp(), opts_.comm_timeout));
}

Status ModelRunner::InitCommunicator(std::vector<std::unique_ptr<Communicator>> comms) {
  if (on_gpu()) return Internal("InitCommunicator(comms): GPU ranks use NCCL");
  if (static_cast<int>(comms.size()) != tp()) {
    return Internal("InitCommunicator: " + std::to_string(comms.size()) + " communicators for " +
                    std::to_string(tp()) + " ranks");
  }
  for (int r = 0; r < tp(); ++r) {
    if (comms[static_cast<size_t>(r)]->rank() != r || comms[static_cast<size_t>(r)]->size() != tp()) {
      return Internal("InitCommunicator: communicator " + std::to_string(r) + " is not rank " + std::to_string(r) +
                      " of " + std::to_string(tp()));
    }
  }
  for (int r = 0; r < tp(); ++r) {
    static_cast<CpuRank*>(ranks_[static_cast<size_t>(r)].get())->SetComm(std::move(comms[static_cast<size_t>(r)]));
  }
  comm_ready_ = true;
  return Keepalive();
}

Status ModelRunner::AllocateKv(uint64_t bytes_per_rank, int block_size) {
  WSUP_ASSIGN_OR_RETURN(KvLayout layout,
                        KvLayout::Private(ranks_[0]->KvBlockBytes(block_size), block_size, bytes_per_rank));
  return AllocateKv(layout);
}

Status ModelRunner::AllocatePooledKv(const std::vector<std::vector<uint64_t>>& pool_allocations,
                                     uint64_t scratch_bytes_per_rank, int block_size) {
  if (pool_allocations.size() != static_cast<size_t>(tp())) {
    return InvalidArgument(std::to_string(pool_allocations.size()) + " KV pools for " + std::to_string(tp()) +
                           " ranks; each rank's holder makes one");
  }
  for (size_t r = 1; r < pool_allocations.size(); ++r) {
    if (pool_allocations[r] != pool_allocations[0]) {
      return Mismatch("rank " + std::to_string(r) + "'s KV pool is laid out unlike rank 0's; start every holder "
                      "with the same --kv-pool-mib and backend");
    }
  }
  WSUP_ASSIGN_OR_RETURN(KvLayout layout, KvLayout::Pooled(ranks_[0]->KvBlockBytes(block_size), block_size,
                                                          pool_allocations[0], scratch_bytes_per_rank));
  return AllocateKv(layout);
}

Status ModelRunner::AllocateKv(const KvLayout& layout) {
  const int max_tokens = std::max(1, opts_.max_step_tokens) + std::max(1, opts_.max_batch);
  // Each rank allocates and touches its own cache, on its own thread.
  WSUP_RETURN_IF_ERROR(OnAllRanks([&](int rank) {
    return ranks_[static_cast<size_t>(rank)]->AllocateKv(layout, max_tokens, std::max(1, opts_.max_batch));
  }));
  layout_ = layout;
  pool_mapped_ = false;
  return Status::Ok();
}

Status ModelRunner::MapKvPool(const std::vector<std::vector<UniqueFd>>& fds) {
  if (!layout_.pooled()) return Refused("this engine has a private KV cache; start it with --kv-pool");
  if (fds.size() != static_cast<size_t>(tp())) {
    return InvalidArgument(std::to_string(fds.size()) + " KV pools for " + std::to_string(tp()) + " ranks");
  }
  // On this thread, rank after rank, while steps may run on the rank
  // threads: no step touches the pool's span before the scheduler hands
  // out its blocks, and mapping (mmap MAP_FIXED over the reservation, VMM
  // map and access) does not disturb what runs on the rest of the range.
  Status st;
  size_t mapped = 0;
  for (; mapped < fds.size() && st.ok(); ++mapped) st = ranks_[mapped]->MapKvPool(fds[mapped]);
  if (!st.ok()) {
    // Never half mapped: the ranks that mapped let it go again (nothing
    // used it, so there is no device work to wait for).
    for (size_t r = 0; r + 1 < mapped; ++r) {
      Status undo = ranks_[r]->UnmapKvPool();
      if (!undo.ok()) return st.error().With("and unmapping it again failed too: " + undo.error().message());
    }
    return st;
  }
  pool_mapped_ = true;
  return Status::Ok();
}

Status ModelRunner::PrepareKvPool(const std::vector<std::vector<UniqueFd>>& fds) {
  if (!layout_.pooled()) return Refused("this engine has a private KV cache; start it with --kv-pool");
  if (fds.size() != static_cast<size_t>(tp())) {
    return InvalidArgument(std::to_string(fds.size()) + " KV pools for " + std::to_string(tp()) + " ranks");
  }
  for (size_t r = 0; r < fds.size(); ++r) {
    KvMemory* m = ranks_[r]->kv_memory();
    if (!m) return Internal("PrepareKvPool() before AllocateKv()");
    Status st = m->PreparePool(fds[r]);
    if (!st.ok()) {
      DropPreparedKvPool();
      return st;
    }
  }
  return Status::Ok();
}

void ModelRunner::DropPreparedKvPool() {
  for (auto& rank : ranks_) {
    if (KvMemory* m = rank->kv_memory()) m->DropPrepared();
  }
}

Status ModelRunner::WriteKvPool(uint64_t offset, const void* data, size_t n) {
  KvMemory* m = ranks_.empty() ? nullptr : ranks_[0]->kv_memory();
  if (!m) return Unavailable("KV pool: this engine has no KV cache yet");
  return m->WritePool(offset, data, n);
}

Status ModelRunner::ReadKvPool(uint64_t offset, void* out, size_t n) {
  KvMemory* m = ranks_.empty() ? nullptr : ranks_[0]->kv_memory();
  if (!m) return Unavailable("KV pool: this engine has no KV cache yet");
  return m->ReadPool(offset, out, n);
}

KvMemory::MapTimes ModelRunner::last_kv_map_times() {
  KvMemory::MapTimes sum;
  sum.prepared = true;
  for (auto& rank : ranks_) {
    KvMemory* m = rank->kv_memory();
    if (!m) continue;
    const KvMemory::MapTimes t = m->last_map_times();
    sum.prepared = sum.prepared && t.prepared;
    sum.import_ms += t.import_ms;
    sum.map_ms += t.map_ms;
    sum.access_ms += t.access_ms;
  }
  return sum;
}

Status ModelRunner::UnmapKvPool() {
  if (!pool_mapped_) return Status::Ok();
  WSUP_RETURN_IF_ERROR(OnAllRanks([&](int rank) { return ranks_[static_cast<size_t>(rank)]->UnmapKvPool(); }));
  pool_mapped_ = false;
  return Status::Ok();
}

Result<int> ModelRunner::CaptureGraphs() {
  if (num_blocks() == 0) return Internal("CaptureGraphs() before AllocateKv()");
  std::vector<int> counts(static_cast<size_t>(tp()), 0);
  WSUP_RETURN_IF_ERROR(OnAllRanks([&](int rank) -> Status {
    WSUP_ASSIGN_OR_RETURN(counts[static_cast<size_t>(rank)],
                          ranks_[static_cast<size_t>(rank)]->CaptureGraphs(std::max(1, opts_.max_batch)));
    return Status::Ok();
  }));
  return counts[0];
}

Status ModelRunner::Warmup() {
  if (num_blocks() == 0) return Internal("Warmup() before AllocateKv()");
  // On the engine's own blocks: the pool may be another engine's now.
  const int bs = block_size();
  const int n = std::min<int>(4, layout_.scratch_blocks * bs);
  std::vector<int32_t> table;
  for (int i = 0; i * bs < n; ++i) table.push_back(layout_.scratch_first + i);
  StepBatch b;
  for (int i = 0; i < n; ++i) {
    b.tokens.push_back(i % static_cast<int32_t>(dims().vocab));
    b.positions.push_back(i);
    b.seq.push_back(0);
  }
  b.block_tables.push_back(&table);
  b.logit_rows.push_back(n - 1);
  std::vector<float> logits;
  return Step(b, &logits);
}

Status ModelRunner::Step(const StepBatch& batch, std::vector<float>* logits) {
  if (!comm_ready_ || num_blocks() == 0) return Internal("Step() before InitCommunicator() and AllocateKv()");
  const auto t0 = std::chrono::steady_clock::now();
  Status st = OnAllRanks([&](int rank) {
    std::vector<float>* out = rank == 0 ? logits : &rank_logits_[static_cast<size_t>(rank)];
    return ranks_[static_cast<size_t>(rank)]->Forward(batch, out);
  });
  // One writer (the scheduler thread): load and store, no read-modify-write race.
  step_ms_total_.store(step_ms_total_.load() +
                       std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  steps_.store(steps_.load() + 1);
  return st;
}

Status ModelRunner::Keepalive() {
  if (!comm_ready_) return Internal("Keepalive() before InitCommunicator()");
  const int n = tp();
  return OnAllRanks([&](int rank) -> Status {
    float v[2] = {static_cast<float>(rank + 1), 1.0f};
    WSUP_RETURN_IF_ERROR(ranks_[static_cast<size_t>(rank)]->AllReduceHost(v, 2));
    const int sum = n * (n + 1) / 2;  // 1 + 2 + ... + n, exact in float
    const float want = static_cast<float>(sum);
    if (v[0] != want || v[1] != static_cast<float>(n)) {
      return Internal("communicator keepalive on rank " + std::to_string(rank) + ": the all-reduce gave " +
                      std::to_string(v[0]) + "/" + std::to_string(v[1]) + " instead of " + std::to_string(want) + "/" +
                      std::to_string(n) + "; the communicator is broken: restart the engine");
    }
    return Status::Ok();
  });
}

}  // namespace wsup::engine
