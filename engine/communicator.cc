#include "engine/communicator.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>
#include <string>

namespace wsup::engine {

namespace {

// Shared state of one in-process group. Collectives are built from a
// generation barrier: publish a pointer, barrier, read everyone's data into
// private memory, barrier (nobody reads a peer's buffer after it), write.
class Group {
 public:
  Group(int size, std::chrono::milliseconds timeout)
      : size_(size), timeout_(timeout), in_(static_cast<size_t>(size)) {}

  int size() const { return size_; }

  Status Barrier(int rank) {
    std::unique_lock<std::mutex> lk(mu_);
    if (broken_) return *error_;
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return Status::Ok();
    }
    if (!cv_.wait_for(lk, timeout_, [&] { return generation_ != gen || broken_; })) {
      broken_ = true;
      error_ = Timeout("in-process communicator: rank " + std::to_string(rank) + " waited " +
                       std::to_string(timeout_.count()) + " ms for the other " + std::to_string(size_ - 1) +
                       " ranks at a collective; a rank is stuck or failed: restart the engine");
      cv_.notify_all();
      return *error_;
    }
    if (broken_ && generation_ == gen) return *error_;
    return Status::Ok();
  }

  void Publish(int rank, const float* p) { in_[static_cast<size_t>(rank)] = p; }
  const float* Peer(int rank) const { return in_[static_cast<size_t>(rank)]; }

 private:
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
  std::optional<Error> error_;
  // Written by rank r before a barrier, read by all after it.
  std::vector<const float*> in_;
};

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const char* kind() const override { return "threads"; }

  Status AllReduceSum(float* data, size_t n) override {
    if (group_->size() == 1) return Status::Ok();
    group_->Publish(rank_, data);
    WSUP_RETURN_IF_ERROR(group_->Barrier(rank_));
    // Every rank adds in rank order, so every rank gets the same bits.
    scratch_.assign(group_->Peer(0), group_->Peer(0) + n);
    for (int r = 1; r < group_->size(); ++r) {
      const float* p = group_->Peer(r);
      for (size_t i = 0; i < n; ++i) scratch_[i] += p[i];
    }
    WSUP_RETURN_IF_ERROR(group_->Barrier(rank_));
    std::memcpy(data, scratch_.data(), n * sizeof(float));
    return Status::Ok();
  }

  Status AllGather(const float* in, size_t n, float* out) override {
    if (group_->size() == 1) {
      if (out != in) std::memmove(out, in, n * sizeof(float));
      return Status::Ok();
    }
    group_->Publish(rank_, in);
    WSUP_RETURN_IF_ERROR(group_->Barrier(rank_));
    for (int r = 0; r < group_->size(); ++r) {
      std::memcpy(out + static_cast<size_t>(r) * n, group_->Peer(r), n * sizeof(float));
    }
    return group_->Barrier(rank_);
  }

 private:
  std::shared_ptr<Group> group_;
  int rank_;
  std::vector<float> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeInProcessGroup(int size, std::chrono::milliseconds timeout) {
  auto group = std::make_shared<Group>(size, timeout);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<InProcessCommunicator>(group, r));
  return out;
}

}  // namespace wsup::engine
