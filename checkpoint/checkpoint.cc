#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/fs.h"
#include "common/json_limits.h"
#include "checkpoint/json_text.h"
#include "common/sha256.h"

namespace wsup {

using json = nlohmann::json;
using checkpoint_text::CheckDepth;
using checkpoint_text::Quote;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kConfigFile = "config.json";

struct DTypeEntry {
  DType dtype;
  const char* name;
  const char* torch_name;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kF64, "F64", "float64", 8},
    {DType::kF32, "F32", "float32", 4},
    {DType::kF16, "F16", "float16", 2},
    {DType::kBF16, "BF16", "bfloat16", 2},
    {DType::kF8E4M3, "F8_E4M3", "float8_e4m3fn", 1},
    {DType::kF8E5M2, "F8_E5M2", "float8_e5m2", 1},
    {DType::kI64, "I64", "int64", 8},
    {DType::kI32, "I32", "int32", 4},
    {DType::kI16, "I16", "int16", 2},
    {DType::kI8, "I8", "int8", 1},
    {DType::kU8, "U8", "uint8", 1},
    {DType::kBool, "BOOL", "bool", 1},
};

std::string KnownDTypeNames() {
  std::string s;
  for (const auto& e : kDTypes) {
    if (!s.empty()) s += ", ";
    s += e.name;
  }
  return s;
}

std::string QuoteName(std::string_view name) {
  std::string s(name.substr(0, std::min<size_t>(name.size(), 200)));
  if (name.size() > 200) s += "...";
  return "'" + s + "'";
}

// pread until `len` bytes arrived; a short file is reported, not retried.
Status PreadFull(int fd, void* dst, uint64_t len, uint64_t offset, const std::string& path) {
  auto* p = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < len) {
    // Linux transfers at most ~2 GiB per call; ask for 1 GiB at a time.
    size_t want = static_cast<size_t>(std::min<uint64_t>(len - done, 1ull << 30));
    ssize_t n = ::pread(fd, p + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path + ": read of " + std::to_string(len) + " bytes at offset " +
                            std::to_string(offset) + " failed",
                        errno);
    }
    if (n == 0) {
      return Corrupt(path + ": the file ended at byte " + std::to_string(offset + done) + " while reading " +
                     std::to_string(len) + " bytes at offset " + std::to_string(offset) +
                     "; it shrank after it was opened (is something rewriting it?): restore the file");
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// Reads and parses a small JSON file; `what` says what it is for messages.
Result<json> ReadJsonFile(const std::string& path, const char* fix) {
  auto text = ReadFile(path, kMaxConfigBytes);
  if (!text.ok()) {
    if (text.error().code() == Code::kIo) {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return NotFound(path + ": missing; " + fix);
    }
    return text.error();
  }
  WSUP_RETURN_IF_ERROR(CheckDepth(*text, path, fix));
  try {
    return json::parse(*text);
  } catch (const json::exception& e) {
    return Corrupt(path + ": not valid JSON (" + e.what() + "); " + fix);
  }
}

}  // namespace

Result<DType> ParseDType(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return Corrupt("unknown dtype " + QuoteName(name) + " (known: " + KnownDTypeNames() + ")");
}

const char* DTypeName(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

Result<DType> DTypeFromTorchName(std::string_view name) {
  std::string_view n = name;
  if (n.substr(0, 6) == "torch.") n.remove_prefix(6);
  for (const auto& e : kDTypes) {
    if (n == e.torch_name) return e.dtype;
  }
  if (n == "float") return DType::kF32;
  if (n == "half") return DType::kF16;
  return InvalidArgument(
      "unknown torch dtype " + QuoteName(name) +
      "; use one of float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, int64, "
      "int32, int16, int8, uint8, bool");
}


int64_t TensorInfo::numel() const {
  uint64_t n = 1;  // unsigned: a hand-built TensorInfo must not make this undefined
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return static_cast<int64_t>(n);
}

Result<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, size_t len, uint64_t file_size,
                                                 const std::string& file_name) {
  const std::string& f = file_name;
  const std::string redownload = "the file is damaged or not a safetensors file: re-download it";
  if (file_size < 8) {
    return Corrupt(f + ": the file is " + std::to_string(file_size) +
                   " bytes, shorter than the 8-byte header length; the file is truncated: re-download it");
  }
  if (len < 8) {
    return Internal(f + ": only " + std::to_string(len) +
                    " bytes of the file were passed to the header parser");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian
  if (n > file_size - 8) {
    return Corrupt(f + ": the header length " + std::to_string(n) + " runs past the file's " +
                   std::to_string(file_size) +
                   " bytes; the file is truncated or not a safetensors file: "
                   "re-download it");
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    return Corrupt(f + ": the header length " + std::to_string(n) + " is more than the " +
                   std::to_string(kMaxSafetensorsHeaderBytes) + " bytes wsup accepts; " + redownload);
  }
  if (n < 2) {
    return Corrupt(f + ": the header length is " + std::to_string(n) + ", too short for a JSON object; " +
                   redownload);
  }
  if (len - 8 < n) {
    return Internal(f + ": the header parser was given " + std::to_string(len) +
                    " bytes but the header needs " + std::to_string(8 + n));
  }
  const char* text = reinterpret_cast<const char*>(data + 8);

  // Duplicate keys would silently replace each other in the parsed object;
  // note them while parsing instead.
  std::string duplicate;
  std::set<std::string> seen;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && parsed.is_string() && duplicate.empty()) {
      if (!seen.insert(parsed.get<std::string>()).second) duplicate = parsed.get<std::string>();
    }
    return true;
  };
  WSUP_RETURN_IF_ERROR(CheckDepth(std::string_view(text, n), f + ": the header", "not a safetensors header; " + redownload));
  json h;
  try {
    h = json::parse(text, text + n, cb);
  } catch (const json::exception& e) {
    return Corrupt(f + ": the header is not valid JSON (" + e.what() + "); " + redownload);
  }
  if (!h.is_object()) {
    return Corrupt(f + ": the header is " + Quote(h) + ", not a JSON object of tensors; " + redownload);
  }
  if (!duplicate.empty()) {
    return Corrupt(f + ": tensor " + QuoteName(duplicate) + " appears twice in the header; " + redownload);
  }

  SafetensorsHeader out;
  out.header_len = n;
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = file_size - data_start;
  out.tensors.reserve(h.size());
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      bool strings = v.is_object();
      for (auto m = v.begin(); strings && m != v.end(); ++m) strings = m->is_string();
      if (!strings) {
        return Corrupt(f + ": __metadata__ is " + Quote(v) + ", not an object of strings; " + redownload);
      }
      out.metadata_json = v.dump(-1, ' ', false, json::error_handler_t::replace);
      continue;
    }
    const std::string t = f + ": tensor " + QuoteName(name);
    if (!v.is_object()) return Corrupt(t + ": entry is " + Quote(v) + ", not an object; " + redownload);
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) {
      return Corrupt(t + ": 'dtype' is missing or not a string; " + redownload);
    }
    auto dtype = ParseDType(dt->get<std::string>());
    if (!dtype.ok()) {
      return Corrupt(t + ": " + dtype.error().message() +
                     "; the file was written for a format wsup does not read: convert the checkpoint to a "
                     "known dtype or re-download it");
    }
    if (sh == v.end() || !sh->is_array()) {
      return Corrupt(t + ": 'shape' is missing or not a list; " + redownload);
    }
    if (sh->size() > 16) {
      return Corrupt(t + ": 'shape' has " + std::to_string(sh->size()) + " dimensions, more than 16; " +
                     redownload);
    }
    TensorInfo info;
    info.name = name;
    info.dtype = *dtype;
    info.file = 0;
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t d = 0; d < sh->size(); ++d) {
      const json& e = (*sh)[d];
      if (e.is_number_integer() && !e.is_number_unsigned()) {
        return Corrupt(t + ": dimension " + std::to_string(d) + " is " + Quote(e) + ", negative; " +
                       redownload);
      }
      if (!e.is_number_unsigned()) {
        return Corrupt(t + ": dimension " + std::to_string(d) + " is " + Quote(e) + ", not an integer; " +
                       redownload);
      }
      uint64_t dim = e.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX)) {
        overflow = true;
      } else {
        info.shape.push_back(static_cast<int64_t>(dim));
        overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
      }
    }
    uint64_t nbytes = 0;
    if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeSize(*dtype)), &nbytes) ||
        numel > static_cast<uint64_t>(INT64_MAX)) {
      return Corrupt(t + ": shape " + Quote(*sh) + " holds more elements than 2^63 bytes can; " + redownload);
    }
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return Corrupt(t + ": 'data_offsets' is " + (off == v.end() ? std::string("missing") : Quote(*off)) +
                     ", not two non-negative integers [begin, end]; " + redownload);
    }
    uint64_t begin = (*off)[0].get<uint64_t>();
    uint64_t end = (*off)[1].get<uint64_t>();
    if (end < begin) {
      return Corrupt(t + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] end before they begin; " + redownload);
    }
    if (end - begin != nbytes) {
      return Corrupt(t + ": shape " + Quote(*sh) + " of " + DTypeName(*dtype) + " needs " +
                     std::to_string(nbytes) + " bytes but data_offsets [" + std::to_string(begin) + ", " +
                     std::to_string(end) + "] hold " + std::to_string(end - begin) + "; " + redownload);
    }
    if (end > data_size) {
      uint64_t abs_end = 0;
      if (__builtin_add_overflow(end, data_start, &abs_end)) abs_end = UINT64_MAX;
      return Corrupt(t + ": data ends at byte " + std::to_string(abs_end) + " past the file's " +
                     std::to_string(file_size) + " bytes; the file is truncated: re-download it");
    }
    info.offset = data_start + begin;
    info.nbytes = nbytes;
    out.tensors.push_back(std::move(info));
  }

  // Overlapping ranges would let one tensor's bytes alias another's; sort by
  // where they begin and compare neighbours.
  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  for (size_t i = 1; i < out.tensors.size(); ++i) {
    const TensorInfo& a = out.tensors[i - 1];
    const TensorInfo& b = out.tensors[i];
    if (b.offset < a.offset + a.nbytes && b.nbytes > 0 && a.nbytes > 0) {
      return Corrupt(f + ": tensor " + QuoteName(b.name) + " (bytes " +
                     std::to_string(b.offset - data_start) + ".." +
                     std::to_string(b.offset - data_start + b.nbytes) + ") overlaps tensor " +
                     QuoteName(a.name) + " (bytes " + std::to_string(a.offset - data_start) + ".." +
                     std::to_string(a.offset - data_start + a.nbytes) + "); " + redownload);
    }
  }
  return out;
}

namespace {

// One opened shard: its fd, size and parsed header.
struct OpenedFile {
  std::shared_ptr<int> fd;
  ShardFile file;
  SafetensorsHeader header;
};

std::shared_ptr<int> ShareFd(int fd) {
  return std::shared_ptr<int>(new int(fd), [](int* p) {
    if (*p >= 0) ::close(*p);
    delete p;
  });
}

// Opens one safetensors file and reads its header: one pread of the 8-byte
// length and one of the header; never tensor data.
Result<OpenedFile> OpenShard(const std::string& dir, const std::string& name) {
  OpenedFile o;
  o.file.name = name;
  o.file.path = JoinPath(dir, name);
  const std::string& path = o.file.path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) {
      return NotFound(path + ": missing; the checkpoint is incomplete: re-download it");
    }
    return ErrnoError(path + ": cannot open", e);
  }
  o.fd = ShareFd(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoError(path + ": cannot stat", errno);
  if (!S_ISREG(st.st_mode)) {
    return Corrupt(path + ": not a regular file; point the model path at a checkpoint folder of files");
  }
  o.file.size = static_cast<uint64_t>(st.st_size);
  uint8_t prefix[8] = {};
  if (o.file.size < 8) {
    auto r = ParseSafetensorsHeader(prefix, sizeof prefix, o.file.size, path);
    return r.error();
  }
  WSUP_RETURN_IF_ERROR(PreadFull(fd, prefix, 8, 0, path));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  // Bounds first, so a corrupt length never sizes an allocation.
  if (n > o.file.size - 8 || n > kMaxSafetensorsHeaderBytes) {
    auto r = ParseSafetensorsHeader(prefix, sizeof prefix, o.file.size, path);
    if (!r.ok()) return r.error();
  }
  std::vector<uint8_t> buf(8 + n);
  std::memcpy(buf.data(), prefix, 8);
  WSUP_RETURN_IF_ERROR(PreadFull(fd, buf.data() + 8, n, 8, path));
  WSUP_ASSIGN_OR_RETURN(o.header, ParseSafetensorsHeader(buf.data(), buf.size(), o.file.size, path));
  o.file.header_len = n;
  o.file.header_sha256 = Sha256Hex(buf.data() + 8, n);
  return o;
}

bool IsPlainFileName(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

}  // namespace

Result<Checkpoint> Checkpoint::Open(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return NotFound(dir + ": checkpoint folder not found; check the model path");
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgument(dir +
                           ": not a folder; the model path names a checkpoint folder (config.json plus "
                           "*.safetensors)");
  }
  Checkpoint ck;
  ck.dir_ = dir;

  const std::string config_path = JoinPath(dir, kConfigFile);
  auto config_text = ReadFile(config_path, kMaxConfigBytes);
  if (!config_text.ok()) {
    if (::stat(config_path.c_str(), &st) != 0 && errno == ENOENT) {
      return NotFound(config_path +
                      ": missing; a Hugging Face checkpoint has config.json beside its weights: "
                      "copy it from the model repository");
    }
    return config_text.error();
  }
  WSUP_ASSIGN_OR_RETURN(ck.config_, ParseModelConfig(*config_text, config_path));

  const std::string index_path = JoinPath(dir, kIndexFile);
  std::vector<OpenedFile> opened;
  // weight_map from the index; empty for a single-file checkpoint.
  std::map<std::string, std::string> weight_map;
  bool have_index = ::stat(index_path.c_str(), &st) == 0;
  if (have_index) {
    const char* fix = "restore model.safetensors.index.json from the model repository";
    WSUP_ASSIGN_OR_RETURN(json idx, ReadJsonFile(index_path, fix));
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object()) {
      return Corrupt(index_path + ": has no 'weight_map' object; " + fix);
    }
    std::set<std::string> names;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it->is_string() || !IsPlainFileName(it->get<std::string>())) {
        return Corrupt(index_path + ": tensor " + QuoteName(it.key()) + " maps to " + Quote(*it) +
                       ", not a file name in the checkpoint folder; " + fix);
      }
      weight_map[it.key()] = it->get<std::string>();
      names.insert(it->get<std::string>());
    }
    if (names.empty()) return Corrupt(index_path + ": 'weight_map' names no tensors; " + fix);
    for (const std::string& name : names) {
      auto o = OpenShard(dir, name);
      if (!o.ok()) {
        if (o.error().code() == Code::kNotFound) {
          return NotFound(JoinPath(dir, name) + ": missing, but " + kIndexFile +
                          " names it; the download is incomplete: re-download the checkpoint");
        }
        return o.error();
      }
      opened.push_back(std::move(o).value());
    }
  } else {
    auto o = OpenShard(dir, kSingleFile);
    if (!o.ok()) {
      if (o.error().code() == Code::kNotFound) {
        return NotFound(dir + ": has neither " + kSingleFile + " nor " + kIndexFile +
                        "; point the model path at a Hugging Face safetensors checkpoint (convert .bin "
                        "checkpoints to safetensors first)");
      }
      return o.error();
    }
    opened.push_back(std::move(o).value());
  }

  for (size_t fi = 0; fi < opened.size(); ++fi) {
    OpenedFile& o = opened[fi];
    for (TensorInfo& t : o.header.tensors) {
      t.file = static_cast<int>(fi);
      auto [pos, inserted] = ck.by_name_.emplace(t.name, ck.tensors_.size());
      if (!inserted) {
        const TensorInfo& first = ck.tensors_[pos->second];
        return Corrupt(o.file.path + ": tensor " + QuoteName(t.name) + " is also in " +
                       opened[static_cast<size_t>(first.file)].file.path +
                       "; a tensor must be in exactly one shard: re-download the checkpoint");
      }
      ck.tensors_.push_back(std::move(t));
    }
  }
  if (have_index) {
    for (const TensorInfo& t : ck.tensors_) {
      const OpenedFile& o = opened[static_cast<size_t>(t.file)];
      auto w = weight_map.find(t.name);
      if (w == weight_map.end()) {
        return Corrupt(
            o.file.path + ": tensor " + QuoteName(t.name) + " is not named in " + kIndexFile +
            "; the index and the shards come from different downloads: re-download the checkpoint");
      }
      if (w->second != o.file.name) {
        return Corrupt(
            o.file.path + ": tensor " + QuoteName(t.name) + " is in this file but " + kIndexFile +
            " says it is in " + w->second +
            "; the index and the shards come from different downloads: re-download the checkpoint");
      }
    }
    for (const auto& [name, file] : weight_map) {
      if (ck.by_name_.count(name) == 0) {
        return Corrupt(JoinPath(dir, file) + ": tensor " + QuoteName(name) + " is named by " + kIndexFile +
                       " but absent from this file; the shard is from a different download: re-download it");
      }
    }
  }
  for (OpenedFile& o : opened) {
    ck.files_.push_back(std::move(o.file));
    ck.fds_.push_back(std::move(o.fd));
  }
  return ck;
}

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.nbytes;
  return n;
}

Status Checkpoint::ReadTensor(const TensorInfo& t, void* dst) const {
  auto s = ReadRange(t.file, t.offset, t.nbytes, dst);
  if (!s.ok()) return s.error().With("tensor " + QuoteName(t.name));
  return Status::Ok();
}

Status Checkpoint::ReadRange(int file, uint64_t offset, uint64_t len, void* dst) const {
  if (file < 0 || static_cast<size_t>(file) >= files_.size()) {
    return Internal(dir_ + ": read from file index " + std::to_string(file) + " but the checkpoint has " +
                    std::to_string(files_.size()) + " files");
  }
  const ShardFile& f = files_[static_cast<size_t>(file)];
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, len, &end) || end > f.size) {
    return Internal(f.path + ": read of " + std::to_string(len) + " bytes at offset " +
                    std::to_string(offset) + " runs past the file's " + std::to_string(f.size) + " bytes");
  }
  return PreadFull(*fds_[static_cast<size_t>(file)], dst, len, offset, f.path);
}

}  // namespace wsup
