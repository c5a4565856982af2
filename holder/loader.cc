#include "holder/loader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "common/unique_fd.h"

namespace wsup {
namespace {

uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }
uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string TensorWho(const ShardedTensor& t) { return "tensor '" + t.name + "'"; }

Error PlanMismatch(const ShardedTensor& t, const std::string& why) {
  return Internal(TensorWho(t) + ": the sharding plan does not fit its source tensor (" + why +
                  "); this is a wsup bug in checkpoint/sharding.cc: report it with the checkpoint's "
                  "config.json");
}

}  // namespace

Result<std::vector<CopyPiece>> PlanCopies(const Checkpoint& ckpt, const std::vector<ShardedTensor>& shards,
                                          const Manifest& manifest) {
  if (manifest.entries.size() != shards.size()) {
    return Internal("the manifest has " + std::to_string(manifest.entries.size()) + " entries for " +
                    std::to_string(shards.size()) +
                    " tensors: a wsup bug (PlanLayout keeps one entry a tensor)");
  }
  const auto& tensors = ckpt.tensors();
  std::vector<CopyPiece> pieces;
  pieces.reserve(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardedTensor& t = shards[i];
    const ManifestEntry& e = manifest.entries[i];
    if (t.source >= tensors.size()) return PlanMismatch(t, "source index out of range");
    const TensorInfo& src = tensors[t.source];
    if (src.dtype != t.dtype) return PlanMismatch(t, "dtype differs from the source's");
    if (e.name != t.name || e.nbytes != t.nbytes) return PlanMismatch(t, "manifest entry differs");
    if (t.nbytes == 0) continue;
    if (src.file < 0 || static_cast<size_t>(src.file) >= ckpt.files().size()) {
      return PlanMismatch(t, "source file index out of range");
    }

    CopyPiece p;
    p.file = src.file;
    p.alloc = e.alloc;
    p.dst_offset = e.offset;
    p.tensor = i;
    const uint64_t esize = DTypeSize(src.dtype);
    switch (t.split) {
      case Split::kReplicate: {
        if (t.nbytes != src.nbytes) return PlanMismatch(t, "a replicated tensor must be whole");
        p.src_offset = src.offset;
        p.row_bytes = p.src_stride = t.nbytes;
        break;
      }
      case Split::kRows: {
        if (src.shape.empty() || t.shape.empty() || src.shape[0] <= 0)
          return PlanMismatch(t, "a row split needs rows");
        uint64_t row = src.nbytes / static_cast<uint64_t>(src.shape[0]);
        if (t.start < 0 || t.start + t.shape[0] > src.shape[0] ||
            t.nbytes != row * static_cast<uint64_t>(t.shape[0])) {
          return PlanMismatch(t, "rows " + std::to_string(t.start) + "+" + std::to_string(t.shape[0]) +
                                     " of " + std::to_string(src.shape[0]));
        }
        p.src_offset = src.offset + static_cast<uint64_t>(t.start) * row;
        p.row_bytes = p.src_stride = t.nbytes;
        break;
      }
      case Split::kCols: {
        if (src.shape.size() < 2 || t.shape.size() != src.shape.size()) {
          return PlanMismatch(t, "a column split needs two or more dimensions");
        }
        uint64_t inner = esize;
        for (size_t d = 2; d < src.shape.size(); ++d) inner *= static_cast<uint64_t>(src.shape[d]);
        uint64_t src_row = static_cast<uint64_t>(src.shape[1]) * inner;
        uint64_t local_row = static_cast<uint64_t>(t.shape[1]) * inner;
        uint64_t outer = static_cast<uint64_t>(src.shape[0]);
        if (t.shape[0] != src.shape[0] || t.start < 0 || t.start + t.shape[1] > src.shape[1] ||
            t.nbytes != outer * local_row) {
          return PlanMismatch(t, "columns " + std::to_string(t.start) + "+" + std::to_string(t.shape[1]) +
                                     " of " + std::to_string(src.shape[1]));
        }
        p.src_offset = src.offset + static_cast<uint64_t>(t.start) * inner;
        if (local_row == src_row) {  // the whole tensor (tp 1): one run
          p.row_bytes = p.src_stride = t.nbytes;
        } else {
          p.row_bytes = local_row;
          p.src_stride = src_row;
          p.rows = outer;
        }
        break;
      }
    }
    if (p.src_end() > src.offset + src.nbytes) return PlanMismatch(t, "slice ends past the source tensor");
    pieces.push_back(p);
  }
  return pieces;
}

std::vector<ReadChunk> PlanReads(std::vector<CopyPiece>& pieces, const std::vector<uint64_t>& file_sizes,
                                 uint64_t max_chunk) {
  std::sort(pieces.begin(), pieces.end(), [](const CopyPiece& a, const CopyPiece& b) {
    return a.file != b.file ? a.file < b.file : a.src_offset < b.src_offset;
  });
  std::vector<ReadChunk> chunks;
  size_t i = 0;
  while (i < pieces.size()) {
    // One extent: pieces of one file whose gaps are at most kMergeGap.
    const int file = pieces[i].file;
    const size_t first = i;
    uint64_t begin = pieces[i].src_offset;
    uint64_t end = pieces[i].src_end();
    ++i;
    while (i < pieces.size() && pieces[i].file == file && pieces[i].src_offset <= end + kMergeGap) {
      end = std::max(end, pieces[i].src_end());
      ++i;
    }
    const size_t last = i;
    const uint64_t fsize = static_cast<size_t>(file) < file_sizes.size() ? file_sizes[file] : end;
    size_t cand = first;  // first piece that may still intersect the next chunk
    for (uint64_t off = AlignDown(begin, kIoAlign); off < end;) {
      ReadChunk c;
      c.file = file;
      c.offset = off;
      c.len = std::min(max_chunk, AlignUp(end, kIoAlign) - off);
      c.valid = off >= fsize ? 0 : std::min(c.len, fsize - off);
      const uint64_t c_end = off + c.len;
      while (cand < last && pieces[cand].src_end() <= off) ++cand;
      for (size_t k = cand; k < last && pieces[k].src_offset < c_end; ++k) {
        if (pieces[k].src_end() > off) c.pieces.push_back(static_cast<uint32_t>(k));
      }
      off = c_end;
      chunks.push_back(std::move(c));
    }
  }
  return chunks;
}

namespace {

// How staged bytes reach the arena, for one reader thread. Copies may be
// asynchronous until Fence(): after it, the staging buffer may be reused
// only once WaitFence() on the same event returns.
class Worker {
 public:
  virtual ~Worker() = default;
  virtual Status Copy(uint32_t alloc, uint64_t dst_offset, const uint8_t* src, uint64_t len) = 0;
  virtual Status Copy2D(uint32_t alloc, uint64_t dst_offset, const uint8_t* src, uint64_t src_pitch,
                        uint64_t width, uint64_t rows) = 0;
  virtual Status Fence(void* event) = 0;
  // Waits for every copy this worker issued; called before the thread ends,
  // also after an error, so no copy reads a buffer after it is freed.
  virtual Status Drain() = 0;
};

class HostWorker final : public Worker {
 public:
  explicit HostWorker(const FillDest& d) : d_(d) {}
  Status Copy(uint32_t alloc, uint64_t dst_offset, const uint8_t* src, uint64_t len) override {
    std::memcpy(d_.host_bases[alloc] + dst_offset, src, len);
    return {};
  }
  Status Copy2D(uint32_t alloc, uint64_t dst_offset, const uint8_t* src, uint64_t src_pitch, uint64_t width,
                uint64_t rows) override {
    uint8_t* dst = d_.host_bases[alloc] + dst_offset;
    for (uint64_t r = 0; r < rows; ++r) std::memcpy(dst + r * width, src + r * src_pitch, width);
    return {};
  }
  Status Fence(void*) override { return {}; }
  Status Drain() override { return {}; }

 private:
  const FillDest& d_;
};

class CudaWorker final : public Worker {
 public:
  static Result<std::unique_ptr<CudaWorker>> Create(const FillDest& d) {
    WSUP_RETURN_IF_ERROR(d.context->MakeCurrent());
    WSUP_ASSIGN_OR_RETURN(cuda::Stream s, cuda::StreamCreate());
    return std::unique_ptr<CudaWorker>(new CudaWorker(d, s));
  }
  ~CudaWorker() override {
    (void)Drain();
    cuda::StreamDestroy(stream_);
  }
  Status Copy(uint32_t alloc, uint64_t dst_offset, const uint8_t* src, uint64_t len) override {
    return cuda::CopyHtoDAsync(d_.device_bases[alloc] + dst_offset, src, len, stream_);
  }
  Status Copy2D(uint32_t alloc, uint64_t dst_offset, const uint8_t* src, uint64_t src_pitch, uint64_t width,
                uint64_t rows) override {
    return cuda::Copy2DHtoDAsync(d_.device_bases[alloc] + dst_offset, width, src, src_pitch, width, rows,
                                 stream_);
  }
  Status Fence(void* event) override { return cuda::EventRecord(event, stream_); }
  Status Drain() override { return cuda::StreamSynchronize(stream_); }

 private:
  CudaWorker(const FillDest& d, cuda::Stream s) : d_(d), stream_(s) {}
  const FillDest& d_;
  cuda::Stream stream_;
};

// A bounded pool of staging buffers, allocated on first need (so a small
// model never allocates more than it uses). A buffer handed back may still
// be the source of in-flight copies: its event is waited on before reuse.
class StagingPool {
 public:
  StagingPool(bool cuda, size_t buffer_bytes, int max_buffers)
      : cuda_(cuda), bytes_(buffer_bytes), max_(max_buffers) {}
  ~StagingPool() {
    for (auto& b : bufs_) {
      if (cuda_) {
        if (b.event) cuda::EventDestroy(b.event);
        cuda::PinnedFree(b.data);
      } else {
        ::munmap(b.data, bytes_);
      }
    }
  }

  // Returns a buffer index, or -1 once Abort() was called. Needs the
  // caller's cuda context current (pinned memory and events belong to it).
  Result<int> Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (aborted_) return -1;
      if (!free_.empty()) {
        int b = free_.front();
        free_.pop_front();
        lock.unlock();
        if (bufs_[b].fenced) {
          WSUP_RETURN_IF_ERROR(cuda::EventSynchronize(bufs_[b].event));
          bufs_[b].fenced = false;
        }
        return b;
      }
      if (static_cast<int>(bufs_.size()) < max_) {
        Buffer buf;
        if (cuda_) {
          WSUP_ASSIGN_OR_RETURN(buf.data, cuda::PinnedAlloc(bytes_));
          auto ev = cuda::EventCreate();
          if (!ev.ok()) {
            cuda::PinnedFree(buf.data);
            return ev.error();
          }
          buf.event = *ev;
        } else {
          void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          if (p == MAP_FAILED) {
            return ErrnoError("staging buffer of " + std::to_string(bytes_) +
                                  " bytes (lower staging_bytes or staging_buffers)",
                              errno);
          }
          buf.data = p;
        }
        bufs_.push_back(buf);
        return static_cast<int>(bufs_.size()) - 1;
      }
      cv_.wait(lock);
    }
  }

  void Release(int b, bool fenced) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      bufs_[b].fenced = fenced;
      free_.push_back(b);
    }
    cv_.notify_one();
  }

  void Abort() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_ = true;
    }
    cv_.notify_all();
  }

  uint8_t* data(int b) {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<uint8_t*>(bufs_[b].data);
  }
  void* event(int b) {
    std::lock_guard<std::mutex> lock(mu_);
    return bufs_[b].event;
  }
  uint64_t peak_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return bufs_.size() * bytes_;
  }

 private:
  struct Buffer {
    void* data = nullptr;
    void* event = nullptr;
    bool fenced = false;
  };
  const bool cuda_;
  const size_t bytes_;
  const int max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Buffer> bufs_;  // a deque: elements never move, so data() stays valid
  std::deque<int> free_;     // oldest first, so the buffer most likely done is reused first
  bool aborted_ = false;
};

// One checkpoint file, open twice: with O_DIRECT (when the file system
// allows it) for aligned reads, and buffered for the rest.
struct SourceFile {
  std::string path;
  UniqueFd direct;
  UniqueFd buffered;
  std::atomic<bool> direct_ok{false};
};

class Reader {
 public:
  explicit Reader(std::vector<std::unique_ptr<SourceFile>>& files) : files_(files) {}

  // Reads chunk c into buf; returns the bytes read (c.valid on success).
  Result<uint64_t> Read(const ReadChunk& c, uint8_t* buf, uint64_t* direct_bytes) {
    SourceFile& f = *files_[c.file];
    uint64_t got = 0;
    if (f.direct_ok.load(std::memory_order_relaxed)) {
      // O_DIRECT: offset, length and buffer are 4 KiB aligned; a short read
      // happens only at the end of the file.
      while (got < c.valid) {
        ssize_t n = ::pread(f.direct.get(), buf + got, c.len - got, static_cast<off_t>(c.offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EINVAL) {
          // This file system refuses O_DIRECT for this request: stay buffered for this file.
          f.direct_ok.store(false, std::memory_order_relaxed);
          break;
        }
        if (n < 0) return ErrnoError(f.path + ": read at offset " + std::to_string(c.offset + got), errno);
        if (n == 0) break;
        got += static_cast<uint64_t>(n);
        *direct_bytes += static_cast<uint64_t>(n);
        if (got % kIoAlign != 0) break;  // unaligned now: finish buffered
      }
    }
    while (got < c.valid) {
      ssize_t n = ::pread(f.buffered.get(), buf + got, c.valid - got, static_cast<off_t>(c.offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError(f.path + ": read at offset " + std::to_string(c.offset + got), errno);
      if (n == 0) break;
      got += static_cast<uint64_t>(n);
    }
    if (got < c.valid) {
      return IoError(f.path + ": expected " + std::to_string(c.valid) + " bytes at offset " +
                     std::to_string(c.offset) + " but the file ended after " + std::to_string(got) +
                     ": it shrank while loading; restore the checkpoint and load again");
    }
    return got;
  }

 private:
  std::vector<std::unique_ptr<SourceFile>>& files_;
};

// Copies the parts of every piece that chunk c holds (buf = the chunk's bytes).
Status Scatter(const ReadChunk& c, const uint8_t* buf, const std::vector<CopyPiece>& pieces, Worker& w) {
  const uint64_t c0 = c.offset;
  const uint64_t c1 = c.offset + c.valid;
  for (uint32_t pi : c.pieces) {
    const CopyPiece& p = pieces[pi];
    if (p.rows == 1) {
      uint64_t s = std::max(p.src_offset, c0);
      uint64_t e = std::min(p.src_offset + p.row_bytes, c1);
      if (s < e)
        WSUP_RETURN_IF_ERROR(w.Copy(p.alloc, p.dst_offset + (s - p.src_offset), buf + (s - c0), e - s));
      continue;
    }
    if (c1 <= p.src_offset) continue;
    uint64_t r = c0 > p.src_offset ? (c0 - p.src_offset) / p.src_stride : 0;
    const uint64_t r_end = std::min(p.rows, (c1 - p.src_offset + p.src_stride - 1) / p.src_stride);
    // Whole rows inside the chunk go as one strided copy; rows cut by the
    // chunk's edges go piecewise.
    uint64_t run_begin = r, run_len = 0;
    auto flush = [&]() -> Status {
      if (run_len == 0) return {};
      uint64_t src = p.src_offset + run_begin * p.src_stride;
      Status st = run_len == 1
                      ? w.Copy(p.alloc, p.dst_offset + run_begin * p.row_bytes, buf + (src - c0), p.row_bytes)
                      : w.Copy2D(p.alloc, p.dst_offset + run_begin * p.row_bytes, buf + (src - c0),
                                 p.src_stride, p.row_bytes, run_len);
      run_len = 0;
      return st;
    };
    for (; r < r_end; ++r) {
      const uint64_t row0 = p.src_offset + r * p.src_stride;
      const uint64_t row1 = row0 + p.row_bytes;
      if (row0 >= c0 && row1 <= c1) {
        if (run_len == 0) run_begin = r;
        ++run_len;
        continue;
      }
      WSUP_RETURN_IF_ERROR(flush());
      uint64_t s = std::max(row0, c0);
      uint64_t e = std::min(row1, c1);
      if (s < e) {
        WSUP_RETURN_IF_ERROR(
            w.Copy(p.alloc, p.dst_offset + r * p.row_bytes + (s - row0), buf + (s - c0), e - s));
      }
    }
    WSUP_RETURN_IF_ERROR(flush());
  }
  return {};
}

}  // namespace

Status FillArena(const Checkpoint& ckpt, const std::vector<ShardedTensor>& shards, const Manifest& manifest,
                 const FillDest& dest, const LoadOptions& opts, LoadStats* stats) {
  WSUP_ASSIGN_OR_RETURN(std::vector<CopyPiece> pieces, PlanCopies(ckpt, shards, manifest));
  std::vector<uint64_t> sizes;
  for (const auto& f : ckpt.files()) sizes.push_back(f.size);
  const uint64_t max_chunk = AlignUp(std::max<uint64_t>(opts.staging_bytes, kIoAlign), kIoAlign);
  std::vector<ReadChunk> chunks = PlanReads(pieces, sizes, max_chunk);
  if (chunks.empty()) return {};

  // Open only the files something is read from.
  std::vector<std::unique_ptr<SourceFile>> files(ckpt.files().size());
  for (const auto& c : chunks) {
    if (files[c.file]) continue;
    auto f = std::make_unique<SourceFile>();
    f->path = ckpt.files()[c.file].path;
    int fd = ::open(f->path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return ErrnoError(f->path + ": open for loading (check it still exists and is readable)", errno);
    f->buffered.Reset(fd);
    if (opts.direct_io) {
      int dfd = ::open(f->path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      if (dfd >= 0) {
        f->direct.Reset(dfd);
        f->direct_ok = true;
      }
    }
    // Sequential hint for the buffered fallback: larger read-ahead.
    (void)::posix_fadvise(f->buffered.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    files[c.file] = std::move(f);
  }

  uint64_t largest = 0;
  for (const auto& c : chunks) largest = std::max(largest, c.len);
  StagingPool pool(dest.cuda, largest, std::max(1, opts.staging_buffers));
  Reader reader(files);

  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes_read{0}, direct_bytes{0};
  std::mutex err_mu;
  std::optional<Error> first_error;
  auto fail = [&](const Error& e) {
    {
      std::lock_guard<std::mutex> lock(err_mu);
      if (!first_error) first_error = e;
    }
    pool.Abort();
  };

  auto body = [&]() {
    std::unique_ptr<Worker> worker;
    if (dest.cuda) {
      auto w = CudaWorker::Create(dest);
      if (!w.ok()) return fail(w.error());
      worker = std::move(*w);
    } else {
      worker = std::make_unique<HostWorker>(dest);
    }
    uint64_t my_bytes = 0, my_direct = 0;
    for (;;) {
      size_t i = next.fetch_add(1);
      if (i >= chunks.size()) break;
      auto b = pool.Acquire();
      if (!b.ok()) {
        fail(b.error());
        break;
      }
      if (*b < 0) break;  // aborted
      const ReadChunk& c = chunks[i];
      uint8_t* buf = pool.data(*b);
      auto got = reader.Read(c, buf, &my_direct);
      Status st = got.ok() ? Scatter(c, buf, pieces, *worker) : got.status();
      bool fenced = false;
      if (st.ok() && dest.cuda) {
        st = worker->Fence(pool.event(*b));
        fenced = st.ok();
      }
      if (!st.ok()) {
        // Copies out of this buffer may be in flight: drain before anyone reuses it.
        (void)worker->Drain();
        pool.Release(*b, false);
        fail(st.error());
        break;
      }
      my_bytes += *got;
      pool.Release(*b, fenced);
    }
    Status drained = worker->Drain();
    if (!drained.ok()) fail(drained.error());
    bytes_read += my_bytes;
    direct_bytes += my_direct;
  };

  const int nthreads = static_cast<int>(std::min<size_t>(std::max(1, opts.read_threads), chunks.size()));
  std::vector<std::thread> threads;
  threads.reserve(nthreads);
  for (int t = 0; t < nthreads; ++t) threads.emplace_back(body);
  for (auto& t : threads) t.join();

  if (stats) {
    stats->bytes_read += bytes_read.load();
    stats->direct_bytes += direct_bytes.load();
    stats->peak_staging_bytes = std::max(stats->peak_staging_bytes, pool.peak_bytes());
  }
  if (first_error) return *first_error;
  return {};
}

}  // namespace wsup
