#include "checkpoint/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/unique_fd.h"

namespace wsup {

namespace {

Result<uint64_t> TensorBytes(const TensorToWrite& t) {
  uint64_t n = DTypeSize(t.dtype);
  for (int64_t d : t.shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return InvalidArgument("tensor '" + t.name +
                             "': shape has a negative or too large dimension; to write a "
                             "broken header use SafetensorsWriteOptions::header_override");
    }
  }
  if (!t.fill && t.data.size() != n) {
    return InvalidArgument("tensor '" + t.name + "': " + std::to_string(t.data.size()) +
                           " bytes given but its " + "shape and dtype need " + std::to_string(n) +
                           "; pass exactly that many or set fill");
  }
  return n;
}

Status WriteAll(int fd, const void* data, size_t len, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path + ": write failed", errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status WriteBody(int fd, const std::vector<TensorToWrite>& tensors, const std::string& header,
                 const SafetensorsWriteOptions& options, const std::string& path) {
  uint64_t len = options.header_len_override.value_or(header.size());
  uint8_t prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(len >> (8 * i));
  WSUP_RETURN_IF_ERROR(WriteAll(fd, prefix, sizeof prefix, path));
  WSUP_RETURN_IF_ERROR(WriteAll(fd, header.data(), header.size(), path));
  std::vector<uint8_t> chunk;
  for (const TensorToWrite& t : tensors) {
    if (!t.fill) {
      WSUP_RETURN_IF_ERROR(WriteAll(fd, t.data.data(), t.data.size(), path));
      continue;
    }
    WSUP_ASSIGN_OR_RETURN(uint64_t n, TensorBytes(t));
    constexpr uint64_t kChunk = 8 << 20;
    chunk.resize(static_cast<size_t>(std::min(n, kChunk)));
    for (uint64_t off = 0; off < n; off += kChunk) {
      size_t k = static_cast<size_t>(std::min(kChunk, n - off));
      t.fill(off, chunk.data(), k);
      WSUP_RETURN_IF_ERROR(WriteAll(fd, chunk.data(), k, path));
    }
  }
  if (options.truncate_to && ::ftruncate(fd, static_cast<off_t>(*options.truncate_to)) != 0) {
    return ErrnoError(path + ": truncate failed", errno);
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> SafetensorsHeaderJson(const std::vector<TensorToWrite>& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the tensors in the order their data is laid out.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const TensorToWrite& t : tensors) {
    WSUP_ASSIGN_OR_RETURN(uint64_t n, TensorBytes(t));
    if (h.contains(t.name)) {
      return InvalidArgument("tensor '" + t.name +
                             "' is listed twice; to write a broken header use "
                             "SafetensorsWriteOptions::header_override");
    }
    h[t.name] = {{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string s = h.dump();
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const SafetensorsWriteOptions& options) {
  std::string header;
  if (options.header_override) {
    header = *options.header_override;
    for (const TensorToWrite& t : tensors) {
      if (t.fill) WSUP_RETURN_IF_ERROR(TensorBytes(t).status());
    }
  } else {
    WSUP_ASSIGN_OR_RETURN(header, SafetensorsHeaderJson(tensors, options.metadata));
  }
  // No fsync: these are generated files a crash can simply regenerate; the
  // rename only keeps a half-written file from ever carrying the final name.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoError(tmp + ": cannot create", errno);
  Status s = WriteBody(fd.get(), tensors, header, options, tmp);
  if (s.ok() && ::close(fd.Release()) != 0) s = ErrnoError(tmp + ": close failed", errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoError(path + ": rename failed", errno);
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

Status WriteSafetensorsIndex(const std::string& path, const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size) {
  nlohmann::json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  return WriteFileAtomic(path, j.dump(2) + "\n");
}

}  // namespace wsup
