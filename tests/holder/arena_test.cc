#include "holder/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "client/mapping.h"
#include "common/fs.h"
#include "common/sha256.h"
#include "gpu/cuda_driver.h"
#include "holder/loader.h"
#include "testkit/test_util.h"
#include "tests/holder/arena_check.h"
#include "tests/text_check.h"

namespace wsup {
namespace {

const char* const kCheckpoints[] = {"llama-tiny-f32", "llama-tiny-bf16-sharded", "llama-tiny-fp8-block"};

using test::CheckHashes, test::Has, test::Hashes, test::MapDups;

Checkpoint OpenOrFail(const std::string& dir) {
  auto ck = Checkpoint::Open(dir);
  if (!ck.ok()) FAIL(ck.error().ToString());
  return std::move(*ck);
}

// llama-tiny-f32's files copied into dir, opened there (a test may then
// damage the copy).
Checkpoint OpenCopyOfTiny(const test::TempDir& dir) {
  for (const char* f : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(test::TestData("llama-tiny-f32") + "/" + f, dir.Join(f));
  }
  return OpenOrFail(dir.path());
}

std::vector<ShardedTensor> Plan(const Checkpoint& ck, int tp = 1, int rank = 0) {
  auto p = PlanShards(ck, ShardSpec{tp, rank});
  if (!p.ok()) FAIL(p.error().ToString());
  return std::move(*p);
}

ShardedTensor Synthetic(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  ShardedTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  uint64_t n = DTypeSize(dtype);
  for (auto d : t.shape) n *= static_cast<uint64_t>(d);
  t.nbytes = n;
  t.source = 0;
  t.split = Split::kReplicate;
  return t;
}

}  // namespace

TEST_CASE("PlanLayout keeps checkpoint order, aligns every tensor and packs allocations") {
  std::vector<ShardedTensor> ts = {
      Synthetic("a", DType::kF32, {3}),         // 12 bytes
      Synthetic("b", DType::kBF16, {7, 5}),     // 70 bytes
      Synthetic("empty", DType::kF32, {0, 4}),  // 0 bytes
      Synthetic("c", DType::kU8, {1000}),       // 1000 bytes
      Synthetic("big", DType::kF32, {5000}),    // 20000 bytes: over the cap below
      Synthetic("d", DType::kF8E4M3, {300}),    // 300 bytes
  };
  SECTION("one allocation when uncapped") {
    Manifest m = PlanLayout(ts, "host", 4096, UINT64_MAX);
    REQUIRE(m.Validate().ok());
    REQUIRE(m.allocations.size() == 1);
    REQUIRE(m.entries.size() == ts.size());
    uint64_t prev_end = 0;
    for (size_t i = 0; i < ts.size(); ++i) {
      const auto& e = m.entries[i];
      CHECK(e.name == ts[i].name);
      CHECK(e.nbytes == ts[i].nbytes);
      CHECK(e.offset % Manifest::kTensorAlignment == 0);
      CHECK(e.offset >= prev_end);
      // Packed: no more padding than the alignment needs.
      CHECK(e.offset - prev_end < Manifest::kTensorAlignment);
      prev_end = e.offset + e.nbytes;
    }
    CHECK(m.entries[1].dtype == "BF16");
    CHECK(m.allocations[0].size % 4096 == 0);
    CHECK(m.allocations[0].size - prev_end < 4096);
    CHECK(m.backend == "host");
    CHECK(m.device == -1);
    CHECK(m.device_uuid == "host");
  }
  SECTION("a cap splits allocations and an oversized tensor gets its own") {
    Manifest m = PlanLayout(ts, "host", 4096, 2048);
    REQUIRE(m.Validate().ok());
    // a, b, empty, c fit in 2048; big alone; d starts a new one.
    REQUIRE(m.allocations.size() == 3);
    CHECK(m.entries[3].alloc == 0);
    CHECK(m.entries[4].alloc == 1);
    CHECK(m.entries[4].offset == 0);
    CHECK(m.allocations[1].size == 20480);
    CHECK(m.entries[5].alloc == 2);
    CHECK(m.entries[5].offset == 0);
    for (const auto& a : m.allocations) CHECK(a.size % 4096 == 0);
  }
  SECTION("allocations round up to the backend's granularity") {
    Manifest m = PlanLayout(ts, "cuda", 2 << 20, 64ull << 30);
    REQUIRE(m.allocations.size() == 1);
    CHECK(m.allocations[0].size == (2u << 20));
    CHECK(m.device_uuid.empty());  // the loader fills it for cuda
  }
  SECTION("no tensors still gives one (empty) allocation") {
    Manifest m = PlanLayout({}, "host", 4096, UINT64_MAX);
    REQUIRE(m.allocations.size() == 1);
    CHECK(m.Validate().ok());
  }
}

TEST_CASE("PlanReads makes aligned chunks that cover every piece once") {
  std::vector<CopyPiece> pieces;
  auto add = [&](int file, uint64_t off, uint64_t row, uint64_t stride, uint64_t rows) {
    pieces.push_back({.file = file,
                      .src_offset = off,
                      .row_bytes = row,
                      .src_stride = stride,
                      .rows = rows,
                      .tensor = pieces.size()});
  };
  add(1, 100, 50000, 50000, 1);
  add(0, 8, 1000, 1000, 1);
  add(0, 3000, 300, 1000, 40);      // strided: 40 rows of 300 every 1000
  add(0, 10 << 20, 5000, 5000, 1);  // far away: its own extent
  std::vector<uint64_t> sizes = {(10 << 20) + 5001, 50100};
  const uint64_t max_chunk = 16384;
  auto chunks = PlanReads(pieces, sizes, max_chunk);
  // Sorted by file then offset.
  CHECK(pieces[0].file == 0);
  CHECK(pieces[0].src_offset == 8);
  CHECK(pieces.back().file == 1);

  std::map<size_t, uint64_t> covered;  // piece -> bytes of it inside chunks
  for (const auto& c : chunks) {
    CHECK(c.offset % kIoAlign == 0);
    CHECK(c.len % kIoAlign == 0);
    CHECK(c.len <= max_chunk);
    CHECK(c.valid <= c.len);
    CHECK(c.offset + c.valid <= sizes[c.file]);
    for (uint32_t k : c.pieces) {
      const CopyPiece& p = pieces[k];
      REQUIRE(p.file == c.file);
      for (uint64_t r = 0; r < p.rows; ++r) {
        uint64_t s = std::max(p.src_offset + r * p.src_stride, c.offset);
        uint64_t e = std::min(p.src_offset + r * p.src_stride + p.row_bytes, c.offset + c.valid);
        if (s < e) covered[k] += e - s;
      }
    }
  }
  for (size_t k = 0; k < pieces.size(); ++k) {
    INFO("piece " << k);
    CHECK(covered[k] == pieces[k].rows * pieces[k].row_bytes);
  }
  // The two near pieces of file 0 share one extent; the far one does not
  // drag the gap in between into a read.
  uint64_t read = 0;
  for (const auto& c : chunks) read += c.len;
  CHECK(read < (1u << 20));
}

TEST_CASE("a host arena holds every tensor of the real checkpoints, byte for byte") {
  const int variant = GENERATE(0, 1, 2);
  for (const char* name : kCheckpoints) {
    if (!test::HaveTestData(name)) FAIL("test data missing: " << test::TestData(name));
    Checkpoint ck = OpenOrFail(test::TestData(name));
    auto shards = Plan(ck);
    LoadOptions opts;
    if (variant == 1) {  // one thread, one small buffer, buffered reads
      opts.read_threads = 1;
      opts.staging_buffers = 1;
      opts.staging_bytes = 1 << 20;
      opts.direct_io = false;
    } else if (variant == 2) {  // more threads than buffers, small reads
      opts.read_threads = 6;
      opts.staging_buffers = 2;
      opts.staging_bytes = 1 << 20;
    }
    INFO(name << " variant " << variant);
    LoadStats stats;
    auto arena = Arena::Load(ck, shards, opts, &stats);
    if (!arena.ok()) FAIL(arena.error().ToString());
    const Manifest& m = arena->manifest();
    REQUIRE(m.Validate().ok());
    CHECK(m.allocations.size() == 1);
    CHECK(arena->fds().size() == 1);
    CHECK(m.total_bytes() == ck.total_bytes());
    CHECK(stats.bytes_read >= ck.total_bytes());
    CHECK(stats.bytes_read <= ck.total_bytes() + (2ull << 20) * ck.files().size());
    CHECK(stats.seconds > 0);
    CHECK(stats.read_gbps > 0);
    CHECK(stats.arena_bytes == m.arena_bytes());
    CHECK(stats.peak_staging_bytes > 0);
    CHECK(stats.peak_staging_bytes <= static_cast<uint64_t>(opts.staging_buffers) * opts.staging_bytes);
    if (!opts.direct_io) CHECK(stats.direct_bytes == 0);
    MappedArena mapped = MapDups(*arena);
    CheckHashes(mapped, name);
  }
}

TEST_CASE("tensor-parallel arenas hold exactly what ReadShard reads") {
  struct Case {
    const char* name;
    int tp;
  };
  auto c = GENERATE(Case{"llama-tiny-f32", 2}, Case{"llama-tiny-f32", 4}, Case{"llama-tiny-bf16-sharded", 2});
  Checkpoint ck = OpenOrFail(test::TestData(c.name));
  for (int rank = 0; rank < c.tp; ++rank) {
    INFO(c.name << " tp " << c.tp << " rank " << rank);
    auto shards = Plan(ck, c.tp, rank);
    bool strided = false;
    for (const auto& s : shards) strided |= s.split == Split::kCols;
    CHECK(strided);  // the column split path is exercised
    LoadOptions opts;
    opts.staging_bytes = 1 << 20;
    auto arena = Arena::Load(ck, shards, opts);
    if (!arena.ok()) FAIL(arena.error().ToString());
    MappedArena m = MapDups(*arena);
    for (const auto& s : shards) {
      std::string want(s.nbytes, '\0');
      REQUIRE(ReadShard(ck, s, want.data()).ok());
      auto v = m.Find(s.name);
      REQUIRE(v.data);
      CHECK(std::memcmp(v.data, want.data(), s.nbytes) == 0);
    }
  }
}

TEST_CASE("the fill pipeline is exact when chunks cut through rows and tensors") {
  // Chunks of 12 KiB (far below what Load allows) so that nearly every
  // tensor, and many strided rows, straddle chunk boundaries.
  auto name = GENERATE("llama-tiny-f32", "llama-tiny-bf16-sharded", "llama-tiny-fp8-block");
  int tp = std::string(name) == "llama-tiny-fp8-block" ? 1 : 2;
  Checkpoint ck = OpenOrFail(test::TestData(name));
  for (int rank = 0; rank < tp; ++rank) {
    INFO(name << " rank " << rank);
    auto shards = Plan(ck, tp, rank);
    Manifest m = PlanLayout(shards, "host", 4096, UINT64_MAX);
    std::vector<uint8_t> arena(m.allocations[0].size, 0xEE);
    FillDest dest;
    dest.host_bases.push_back(arena.data());
    LoadOptions opts;
    opts.staging_bytes = 12 << 10;
    opts.staging_buffers = 3;
    opts.read_threads = 3;
    opts.direct_io = rank == 0;
    LoadStats stats;
    Status st = FillArena(ck, shards, m, dest, opts, &stats);
    if (!st.ok()) FAIL(st.ToString());
    CHECK(stats.peak_staging_bytes <= 3 * (12 << 10));
    for (size_t i = 0; i < shards.size(); ++i) {
      std::string want(shards[i].nbytes, '\0');
      REQUIRE(ReadShard(ck, shards[i], want.data()).ok());
      INFO(shards[i].name);
      CHECK(std::memcmp(arena.data() + m.entries[i].offset, want.data(), want.size()) == 0);
    }
  }
}

TEST_CASE("a host arena is sealed: no writable mapping, no write, no resize") {
  Checkpoint ck = OpenOrFail(test::TestData("llama-tiny-fp8-block"));
  auto arena = Arena::Load(ck, Plan(ck), LoadOptions{});
  REQUIRE(arena.ok());
  int fd = arena->fds()[0].get();
  const uint64_t size = arena->manifest().allocations[0].size;
  int seals = ::fcntl(fd, F_GET_SEALS);
  CHECK((seals & F_SEAL_WRITE) != 0);
  CHECK((seals & F_SEAL_SHRINK) != 0);
  CHECK((seals & F_SEAL_GROW) != 0);
  CHECK((seals & F_SEAL_SEAL) != 0);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(p == MAP_FAILED);
  if (p != MAP_FAILED) ::munmap(p, size);
  char byte = 1;
  CHECK(::pwrite(fd, &byte, 1, 0) < 0);
  CHECK(errno == EPERM);
  CHECK(::ftruncate(fd, 0) != 0);
  CHECK(::ftruncate(fd, static_cast<off_t>(size * 2)) != 0);
  CHECK(::fcntl(fd, F_ADD_SEALS, 0) != 0);  // the seals themselves are sealed
  // A private writable mapping is allowed but never reaches the shared bytes.
  void* priv = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  REQUIRE(priv != MAP_FAILED);
  std::memset(priv, 0x5A, 4096);
  ::munmap(priv, size);
  MappedArena m = MapDups(*arena);
  CheckHashes(m, "llama-tiny-fp8-block");
}

TEST_CASE("Adopt rebuilds an arena from kept fds, without the checkpoint") {
  Checkpoint ck = OpenOrFail(test::TestData("llama-tiny-bf16-sharded"));
  Manifest manifest;
  std::vector<UniqueFd> kept;
  {
    auto arena = Arena::Load(ck, Plan(ck), LoadOptions{});
    REQUIRE(arena.ok());
    manifest = arena->manifest();
    auto d = arena->DupFds();
    REQUIRE(d.ok());
    kept = std::move(*d);
  }  // the loading arena is gone; only the kept dups hold the memory

  SECTION("identical bytes") {
    auto adopted = Arena::Adopt(manifest, std::move(kept));
    if (!adopted.ok()) FAIL(adopted.error().ToString());
    MappedArena m = MapDups(*adopted);
    CheckHashes(m, "llama-tiny-bf16-sharded");
  }
  SECTION("refuses a manifest of another size") {
    Manifest bigger = manifest;
    bigger.allocations[0].size += 4096;
    auto r = Arena::Adopt(bigger, std::move(kept));
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code() == Code::kMismatch);
    CHECK(Has(r.error().message(), "arena allocation 0"));
  }
  SECTION("refuses the wrong number of fds") {
    kept.push_back(UniqueFd(::dup(kept[0].get())));
    auto r = Arena::Adopt(manifest, std::move(kept));
    REQUIRE_FALSE(r.ok());
    CHECK(Has(r.error().message(), "2 fds for 1 allocations"));
  }
  SECTION("refuses an unsealed memfd and a plain file") {
    const uint64_t size = manifest.allocations[0].size;
    std::vector<UniqueFd> fds;
    SECTION("unsealed memfd") {
      int fd = ::memfd_create("not-sealed", MFD_CLOEXEC);
      REQUIRE(fd >= 0);
      REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
      fds.emplace_back(fd);
    }
    SECTION("plain file") {
      test::TempDir dir;
      int fd = ::open(dir.Join("f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      REQUIRE(fd >= 0);
      REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
      fds.emplace_back(fd);
    }
    auto r = Arena::Adopt(manifest, std::move(fds));
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code() == Code::kRefused);
    CHECK(Has(r.error().message(), "not a memfd sealed read-only"));
  }
  SECTION("refuses an inconsistent manifest") {
    Manifest bad = manifest;
    bad.entries[1].offset = bad.entries[0].offset;
    auto r = Arena::Adopt(bad, std::move(kept));
    REQUIRE_FALSE(r.ok());
    CHECK(Has(r.error().message(), "overlaps"));
  }
}

TEST_CASE("Load refuses bad options and a checkpoint that changes under it") {
  Checkpoint ck = OpenOrFail(test::TestData("llama-tiny-f32"));
  auto shards = Plan(ck);
  SECTION("options") {
    LoadOptions o;
    o.backend = "tpu";
    auto r = Arena::Load(ck, shards, o);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code() == Code::kInvalidArgument);
    CHECK(Has(r.error().message(), "use 'host' or 'cuda'"));
    o = LoadOptions{};
    o.read_threads = 0;
    CHECK(Arena::Load(ck, shards, o).error().code() == Code::kInvalidArgument);
    o = LoadOptions{};
    o.staging_bytes = 100;
    CHECK(Has(Arena::Load(ck, shards, o).error().message(), "staging_bytes"));
    o = LoadOptions{};
    o.staging_buffers = 1000;
    CHECK(Has(Arena::Load(ck, shards, o).error().message(), "staging_buffers"));
  }
  SECTION("a file truncated after Open") {
    test::TempDir dir;
    Checkpoint copy = OpenCopyOfTiny(dir);
    auto plan = Plan(copy);
    REQUIRE(::truncate(dir.Join("model.safetensors").c_str(), 1 << 20) == 0);
    auto r = Arena::Load(copy, plan, LoadOptions{});
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code() == Code::kIo);
    CHECK(Has(r.error().message(), "model.safetensors"));
    CHECK(Has(r.error().message(), "shrank while loading"));
  }
  SECTION("a file removed after Open") {
    test::TempDir dir;
    Checkpoint copy = OpenCopyOfTiny(dir);
    auto plan = Plan(copy);
    std::filesystem::remove(dir.Join("model.safetensors"));
    auto r = Arena::Load(copy, plan, LoadOptions{});
    REQUIRE_FALSE(r.ok());
    CHECK(Has(r.error().message(), "model.safetensors"));
  }
}

TEST_CASE("the cuda backend without a usable driver is a clear Unavailable, not a crash") {
  if (cuda::Init().ok()) {
    WARN("a CUDA driver is present here; the no-driver path is covered by mapping_test's WSUP_LIBCUDA case");
    return;
  }
  Checkpoint ck = OpenOrFail(test::TestData("llama-tiny-f32"));
  LoadOptions o;
  o.backend = "cuda";
  auto r = Arena::Load(ck, Plan(ck), o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code() == Code::kUnavailable);
  CHECK(Has(r.error().message(), "use backend host"));
  if (cuda::BuiltWithCuda()) {
    CHECK(Has(r.error().message(),
              "no CUDA driver (libcuda.so.1 not found): use backend host, or run on a GPU node"));
  }
  // Adopting a cuda manifest says the same.
  Manifest m = PlanLayout(Plan(ck), "cuda", 2 << 20, 64ull << 30);
  m.device = 0;
  m.device_uuid = "GPU-00000000-0000-0000-0000-000000000000";
  std::vector<UniqueFd> fds;
  fds.emplace_back(::memfd_create("x", MFD_CLOEXEC));
  auto a = Arena::Adopt(m, std::move(fds));
  REQUIRE_FALSE(a.ok());
  CHECK(a.error().code() == Code::kUnavailable);
}

TEST_CASE("Synthesize fills each tensor with its pattern") {
  std::vector<ShardedTensor> ts;
  for (int i = 0; i < 50; ++i) {
    std::string name = "t";  // appended, not `"t" + ...`: GCC 12 -O3 gives a false -Wrestrict error on that
    name += std::to_string(i);
    ts.push_back(Synthetic(name, DType::kBF16, {i, 33}));
  }
  auto arena = Arena::Synthesize(ts, LoadOptions{});
  if (!arena.ok()) FAIL(arena.error().ToString());
  MappedArena m = MapDups(*arena);
  REQUIRE(m.size() == 50);
  for (size_t i = 0; i < ts.size(); ++i) {
    auto v = m.Find(ts[i].name);
    REQUIRE(v.data);
    const auto* p = static_cast<const uint8_t*>(v.data);
    for (uint64_t k = 0; k < v.entry->nbytes; ++k) {
      if (p[k] != Arena::SyntheticByte(i)) FAIL("tensor " << i << " byte " << k);
    }
  }
}

}  // namespace wsup
