#include "engine/runner.h"

#include <algorithm>

namespace wsup::engine {

Result<std::unique_ptr<ModelRunner>> ModelRunner::Create(const ModelConfig& cfg,
                                                         std::vector<std::unique_ptr<WeightSource>> weights,
                                                         const RunnerOptions& opts) {
  if (weights.empty()) return InvalidArgument("no weight sources: at least one rank is needed");
  std::unique_ptr<ModelRunner> r(new ModelRunner());
  r->opts_ = opts;
  const int tp = static_cast<int>(weights.size());
  const int threads = opts.threads_per_rank > 0 ? opts.threads_per_rank : ThreadPool::DefaultThreads(tp);
  for (int rank = 0; rank < tp; ++rank) {
    WSUP_ASSIGN_OR_RETURN(ModelDims dims, ModelDims::From(cfg, tp, rank));
    WSUP_ASSIGN_OR_RETURN(auto model, RankModel::Bind(dims, *weights[static_cast<size_t>(rank)], threads));
    r->models_.push_back(std::move(model));
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

Status ModelRunner::InitCommunicator() { return InitCommunicator(MakeInProcessGroup(tp(), opts_.comm_timeout)); }

Status ModelRunner::InitCommunicator(std::vector<std::unique_ptr<Communicator>> comms) {
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
  comms_ = std::move(comms);
  return Keepalive();
}

Status ModelRunner::AllocateKv(uint64_t bytes_per_rank, int block_size) {
  const uint64_t per_block = KvStorage::BlockBytes(dims(), block_size);
  const uint64_t blocks = bytes_per_rank / per_block;
  if (blocks == 0) {
    return InvalidArgument("--kv-cache-mib gives each rank " + std::to_string(bytes_per_rank) +
                           " bytes, less than one KV block of " + std::to_string(block_size) + " tokens (" +
                           std::to_string(per_block) + " bytes); raise --kv-cache-mib");
  }
  const int nb = static_cast<int>(std::min<uint64_t>(blocks, 1u << 30));
  kv_.clear();
  for (int r = 0; r < tp(); ++r) kv_.push_back(std::make_unique<KvStorage>());
  kv_bytes_ = per_block * static_cast<uint64_t>(nb);
  // Each rank touches its own cache, on its own thread.
  return OnAllRanks([&](int rank) { return kv_[static_cast<size_t>(rank)]->Allocate(models_[static_cast<size_t>(rank)]->dims(), nb, block_size); });
}

Status ModelRunner::Warmup() {
  if (kv_.empty()) return Internal("Warmup() before AllocateKv()");
  const int bs = block_size();
  const int n = std::min<int>(4, num_blocks() * bs);
  std::vector<int32_t> table;
  for (int i = 0; i * bs < n; ++i) table.push_back(i);
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
  if (comms_.empty() || kv_.empty()) return Internal("Step() before InitCommunicator() and AllocateKv()");
  Status st = OnAllRanks([&](int rank) {
    std::vector<float>* out = rank == 0 ? logits : &rank_logits_[static_cast<size_t>(rank)];
    return models_[static_cast<size_t>(rank)]->Forward(batch, *kv_[static_cast<size_t>(rank)],
                                                       *comms_[static_cast<size_t>(rank)], out);
  });
  return st;
}

Status ModelRunner::Keepalive() {
  if (comms_.empty()) return Internal("Keepalive() before InitCommunicator()");
  const int n = tp();
  return OnAllRanks([&](int rank) -> Status {
    float v[2] = {static_cast<float>(rank + 1), 1.0f};
    WSUP_RETURN_IF_ERROR(comms_[static_cast<size_t>(rank)]->AllReduceSum(v, 2));
    const float want = static_cast<float>(n * (n + 1) / 2);
    if (v[0] != want || v[1] != static_cast<float>(n)) {
      return Internal("communicator keepalive on rank " + std::to_string(rank) + ": the all-reduce gave " +
                      std::to_string(v[0]) + "/" + std::to_string(v[1]) + " instead of " + std::to_string(want) + "/" +
                      std::to_string(n) + "; the communicator is broken: restart the engine");
    }
    return Status::Ok();
  });
}

}  // namespace wsup::engine
