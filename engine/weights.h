// WeightSource: where a rank's weights live, behind one interface, so the
// model binds the same way to the holder's arena (zero-copy, mode daemon or
// client) and to a disk load into engine memory (mode off, or the client
// mode's fallback).
//
// The disk path reads each tensor with checkpoint/sharding.h (PlanShards +
// ReadShard), from the same plan the holder's loader fills its arena with,
// so both paths give a rank the same bytes for the same ShardSpec.
//
// Ownership: a WeightSource owns the memory (or the mapping) its tensors
// point into; the model only borrows. Thread-safety: immutable once built;
// Find() may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "client/client.h"
#include "client/mapping.h"
#include "common/status.h"

namespace wsup::engine {

// One tensor as this rank holds it (its local shape): in host memory, or in
// device memory when the source's device() is a cuda ordinal.
struct WeightTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // nullptr when the rank holds no tensor of that name.
  const WeightTensor* Find(std::string_view name) const;
  const std::vector<WeightTensor>& tensors() const { return tensors_; }
  // "holder" or "disk".
  virtual const char* source() const = 0;
  // -1: tensors are host pointers; N: device pointers on cuda ordinal N.
  virtual int device() const { return -1; }
  uint64_t total_bytes() const;

 protected:
  void Index();
  std::vector<WeightTensor> tensors_;

 private:
  std::unordered_map<std::string_view, size_t> by_name_;
};

// Reads the rank's shard of every tensor from disk into memory the source
// owns, with `threads` parallel readers.
Result<std::unique_ptr<WeightSource>> LoadWeightsFromDisk(const Checkpoint& ckpt, const ShardSpec& spec,
                                                          int threads);

// Uses a holder's arena as it is mapped, host or cuda (then `device` is the
// ordinal it was mapped on). Refuses dtypes it cannot name.
Result<std::unique_ptr<WeightSource>> WeightsFromArena(MappedArena arena, int device = 0);
// Same, for an attachment made through the holder protocol (kept open so
// the holder counts this engine as a client).
Result<std::unique_ptr<WeightSource>> WeightsFromAttachment(std::unique_ptr<Attachment> attachment, int device = 0);

// Names the place a rank's weights must be for `device` (-1: host) and
// refuses the others with the fix.
Status CheckWeightsDevice(const WeightSource& w, int device);

}  // namespace wsup::engine
