// Safetensors writer: writes a safetensors file (and a sharded checkpoint's
// model.safetensors.index.json) from a list of tensors.
//
// Used by tests, which build small and deliberately broken checkpoints, and
// by the benchmark generator, which writes synthetic checkpoints larger than
// memory (a tensor may produce its bytes piecewise through `fill`). The
// damage options write files the reader must refuse: a raw header in place of
// the generated one, a wrong length prefix, a truncated file.
//
// Files appear under their final name only when complete (written to a
// temporary name and renamed). Stateless; any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/status.h"

namespace wsup {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // Raw little-endian bytes, numel x dtype size of them; or leave empty and set fill.
  std::string data;
  // Writes bytes [offset, offset + len) of the tensor into dst; called in
  // order, in pieces of at most a few MiB.
  std::function<void(uint64_t offset, uint8_t* dst, size_t len)> fill;
};

struct SafetensorsWriteOptions {
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  // Damage, for tests of the reader. The tensors' bytes are written as usual.
  std::optional<std::string> header_override;   // written instead of the generated header JSON
  std::optional<uint64_t> header_len_override;  // written as the 8-byte length prefix
  std::optional<uint64_t> truncate_to;          // the file is cut to this many bytes
};

// The header JSON WriteSafetensors writes for `tensors` (data laid out in the
// given order), padded with spaces to a multiple of 8 bytes as the reference
// writer does, so tensor data starts aligned.
Result<std::string> SafetensorsHeaderJson(const std::vector<TensorToWrite>& tensors,
                                          const std::map<std::string, std::string>& metadata);

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const SafetensorsWriteOptions& options = {});

// weight_map: tensor name -> shard file name. total_size goes in "metadata".
Status WriteSafetensorsIndex(const std::string& path, const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size);

}  // namespace wsup
