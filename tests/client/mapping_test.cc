#include "client/mapping.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "common/fs.h"
#include "common/sha256.h"
#include "gpu/cuda_driver.h"
#include "holder/arena.h"
#include "testkit/fd_channel.h"
#include "testkit/test_util.h"
#include "tests/gpu_skip.h"
#include "tests/holder/arena_check.h"
#include "tests/text_check.h"
#include "tests/wire/wire_check.h"
#include "wire/manifest.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;

const char* const kCheckpoints[] = {"llama-tiny-f32", "llama-tiny-bf16-sharded", "llama-tiny-fp8-block"};

std::string Peer() { return test::BinPath("wsup-test-arena-peer"); }

using test::CheckHashes, test::Has, test::Hashes, test::MapDups, test::NoGpuReason;
#define WSUP_GPU_OR_SKIP() WSUP_GPU_SKIP_IF(NoGpuReason(), "mapping_test")

Arena LoadArena(const std::string& name, const std::string& backend) {
  auto ck = Checkpoint::Open(test::TestData(name));
  if (!ck.ok()) FAIL(ck.error().ToString());
  auto shards = PlanShards(*ck, ShardSpec{1, 0});
  if (!shards.ok()) FAIL(shards.error().ToString());
  LoadOptions opts;
  opts.backend = backend;
  auto arena = Arena::Load(*ck, *shards, opts);
  if (!arena.ok()) FAIL(arena.error().ToString());
  return std::move(*arena);
}

Manifest Good() {
  Manifest m = test::HostManifest({{8192}, {4096}});
  m.entries = {
      {"w", "F32", {4, 8}, 0, 0, 128}, {"b", "BF16", {100}, 0, 256, 200}, {"s", "F8_E4M3", {10}, 1, 0, 10}};
  return m;
}

// A sealed memfd of `size` bytes, as a holder would hand out.
UniqueFd SealedMemfd(uint64_t size) {
  int fd = ::memfd_create("test-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
  REQUIRE(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) == 0);
  return UniqueFd(fd);
}

// A holder process loads `ckpt` and sends the arena to this process, which
// keeps the fds like the supervisor and forwards them to an engine process
// that maps them. The holder is SIGKILLed and this process lets go of its
// fds; the engine must still read every tensor right. With
// map_after_kill, the engine gets the fds only after the holder died, so
// the kept fds alone carried the memory across the death.
void HolderDiesWhileMapped(const std::string& backend, const std::string& ckpt, bool map_after_kill) {
  test::TempDir logs;
  auto a = test::SocketPair();
  auto b = test::SocketPair();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  test::Child holder = test::Child::Start({Peer(), "load", test::TestData(ckpt), backend, "0", "1", "0"},
                                          logs.Join("holder.log"), {a->second.get()});
  a->second.Reset();
  test::Child engine = test::Child::Start({Peer(), "map", "0", test::TestData(ckpt) + "/tensors.json"},
                                          logs.Join("engine.log"), {b->second.get()});
  b->second.Reset();
  auto logs_text = [&] {
    return "holder: " + test::ReadAll(logs.Join("holder.log")) +
           "\nengine: " + test::ReadAll(logs.Join("engine.log"));
  };

  std::string manifest_json, reply;
  std::vector<UniqueFd> kept;
  Status st = test::RecvMessage(a->first.get(), &manifest_json, &kept, 120s);
  INFO(logs_text());
  REQUIRE(st.ok());
  REQUIRE(manifest_json.rfind("{", 0) == 0);
  REQUIRE(!kept.empty());

  auto kill_holder = [&] {
    holder.Kill(SIGKILL);
    REQUIRE(holder.Wait(10s) == 128 + SIGKILL);
  };
  auto forward = [&] {
    std::vector<int> raw;
    for (const auto& fd : kept) raw.push_back(fd.get());
    REQUIRE(test::SendMessage(b->first.get(), manifest_json, raw).ok());
    REQUIRE(test::RecvMessage(b->first.get(), &reply, nullptr, 120s).ok());
    REQUIRE(reply.rfind("mapped ", 0) == 0);
  };
  if (map_after_kill) {
    kill_holder();
    forward();
  } else {
    forward();
    kill_holder();
  }
  kept.clear();  // now only the engine's mapping holds the memory
  REQUIRE(test::SendMessage(b->first.get(), "go").ok());
  REQUIRE(test::RecvMessage(b->first.get(), &reply, nullptr, 120s).ok());
  CHECK(reply == "ok " + std::to_string(Hashes(ckpt).size()));
  CHECK(engine.Wait(60s) == 0);
}

}  // namespace

TEST_CASE("manifests round-trip through JSON") {
  Manifest m = Good();
  nlohmann::json j = ManifestToJson(m);
  auto back = ManifestFromJson(j);
  REQUIRE(back.ok());
  CHECK(ManifestToJson(*back).dump() == j.dump());
  CHECK(back->entries[1].name == "b");
  CHECK(back->entries[1].shape == std::vector<int64_t>{100});
  CHECK(back->total_bytes() == 338);
  CHECK(back->arena_bytes() == 12288);
  // And through text, as it travels.
  auto again = ManifestFromJson(nlohmann::json::parse(j.dump()));
  REQUIRE(again.ok());
  CHECK(again->entries.size() == 3);
}

TEST_CASE("Validate refuses inconsistent manifests, naming the entry and the field") {
  struct Case {
    const char* what;
    std::function<void(Manifest&)> mutate;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"entry outside its allocation",
       [](Manifest& m) { m.entries[1].offset = 8192; },
       {"manifest entry 1 ('b')", "ends past allocation 0"}},
      {"misaligned offset",
       [](Manifest& m) { m.entries[1].offset = 300; },
       {"manifest entry 1 ('b')", "field 'offset'", "multiple of 256"}},
      {"overlap", [](Manifest& m) { m.entries[1].offset = 0; }, {"overlaps", "'w'", "'b'"}},
      {"duplicate name",
       // Entry 0's name, "w", copied: assigning the literal here gives a false
       // -Wrestrict error from GCC 12 at -O3 (the Release build).
       [](Manifest& m) { m.entries[2].name = m.entries[0].name; },
       {"manifest entry 2 ('w')", "duplicate"}},
      {"nbytes != shape x dtype",
       [](Manifest& m) { m.entries[0].nbytes = 127; },
       {"manifest entry 0 ('w')", "field 'nbytes' = 127", "= 128"}},
      {"unknown dtype", [](Manifest& m) { m.entries[0].dtype = "F33"; }, {"field 'dtype'", "F33"}},
      {"negative dimension",
       [](Manifest& m) {
         m.entries[0].shape = {-4, -8};
       },
       {"field 'shape'", "negative"}},
      {"allocation index out of range", [](Manifest& m) { m.entries[2].alloc = 5; }, {"field 'alloc' = 5"}},
      {"unknown backend", [](Manifest& m) { m.backend = "tpu"; }, {"field 'backend'", "tpu"}},
      {"empty allocation", [](Manifest& m) { m.allocations[1].size = 0; }, {"allocation 1", "empty"}},
      {"allocation not page sized",
       [](Manifest& m) { m.allocations[0].size = 8200; },
       {"allocation 0", "page"}},
      {"absurd allocation", [](Manifest& m) { m.allocations[0].size = 1ull << 50; }, {"1 TiB"}},
      {"no allocations",
       [](Manifest& m) {
         m.allocations.clear();
         m.entries.clear();
       },
       {"no allocations"}},
      {"host arena with a device", [](Manifest& m) { m.device = 0; }, {"field 'device'"}},
      {"cuda arena without a GPU uuid",
       [](Manifest& m) {
         m.backend = "cuda";
         m.device = 0;
         m.device_uuid = "host";
       },
       {"field 'device_uuid'"}},
      {"empty name",
       [](Manifest& m) { m.entries[0].name = ""; },
       {"manifest entry 0", "field 'name' is empty"}},
      {"control characters in a name",
       [](Manifest& m) { m.entries[0].name = "a\nb"; },
       {"control characters"}},
      {"absurd rank", [](Manifest& m) { m.entries[2].shape = {1, 1, 1, 1, 1, 1, 1, 1, 10}; }, {"rank 9"}},
      {"shape that overflows",
       [](Manifest& m) {
         m.entries[0].shape = {1ll << 40, 1ll << 40};
       },
       {"more than 1 TiB"}},
  };
  REQUIRE(Good().Validate().ok());
  for (const auto& c : cases) {
    INFO(c.what);
    Manifest m = Good();
    c.mutate(m);
    Status st = m.Validate();
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == Code::kCorrupt);
    for (const auto& s : c.says) {
      INFO(st.error().message());
      CHECK(Has(st.error().message(), s));
    }
    CHECK(Has(st.error().message(), "restart the holder"));
    // The same manifest from JSON is refused the same way.
    auto fj = ManifestFromJson(ManifestToJson(m));
    CHECK_FALSE(fj.ok());
  }
}

TEST_CASE("ManifestFromJson refuses malformed JSON naming the field") {
  const nlohmann::json good = ManifestToJson(Good());
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> mutate;
    const char* says;
  };
  // Entries are arrays: name, dtype, shape, alloc, offset, nbytes.
  const std::vector<Case> cases = {
      {"not an object", [](nlohmann::json& j) { j = nlohmann::json::array(); }, "expected a JSON object"},
      {"other version", [](nlohmann::json& j) { j["version"] = 2; }, "field 'version' = 2"},
      {"missing field", [](nlohmann::json& j) { j.erase("device_uuid"); }, "field 'device_uuid' is missing"},
      {"short entry", [](nlohmann::json& j) { j["entries"][0].erase(5); },
       "manifest entry 0: expected an array of 6"},
      {"entry as object",
       [](nlohmann::json& j) {
         j["entries"][0] = {{"name", "w"}};
       },
       "manifest entry 0"},
      {"other entry fields", [](nlohmann::json& j) { j["entry_fields"][4] = "off"; }, "field 'entry_fields'"},
      {"offset as string", [](nlohmann::json& j) { j["entries"][1][4] = "256"; },
       "manifest entry 1 ('b'): field 'offset'"},
      {"negative offset", [](nlohmann::json& j) { j["entries"][1][4] = -256; }, "unsigned integer"},
      {"float size", [](nlohmann::json& j) { j["allocations"][0]["size"] = 8192.5; },
       "allocation 0: field 'size'"},
      {"shape of strings",
       [](nlohmann::json& j) {
         j["entries"][0][2] = {"4", "8"};
       },
       "array of integers"},
      {"name as number", [](nlohmann::json& j) { j["entries"][0][0] = 7; }, "field 'name'"},
      {"entries not an array", [](nlohmann::json& j) { j["entries"] = "x"; },
       "field 'entries' is not an array"},
      {"alloc too large", [](nlohmann::json& j) { j["entries"][0][3] = 1ull << 40; }, "field 'alloc'"},
      {"device string", [](nlohmann::json& j) { j["device"] = "0"; }, "field 'device'"},
      {"huge shape value", [](nlohmann::json& j) { j["entries"][0][2] = {1e300}; }, "array of integers"},
      {"overlap after parse", [](nlohmann::json& j) { j["entries"][1][4] = 0; }, "overlaps"},
  };

  for (const auto& c : cases) {
    INFO(c.what);
    nlohmann::json j = good;
    c.mutate(j);
    auto r = ManifestFromJson(j);
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message());
    CHECK(Has(r.error().message(), c.says));
  }
}

TEST_CASE("a host arena maps in this process and every tensor reads right") {
  for (const char* name : kCheckpoints) {
    Arena arena = LoadArena(name, "host");
    MappedArena m = MapDups(arena);
    CHECK_FALSE(m.is_cuda());
    CheckHashes(m, name);
    // Direct reads agree with CopyToHost; lookups of absent names are empty.
    const auto& e = m.manifest().entries.front();
    auto v = m.Find(e.name);
    std::vector<uint8_t> copy(e.nbytes);
    REQUIRE(m.CopyToHost(e, copy.data()).ok());
    CHECK(std::memcmp(v.data, copy.data(), e.nbytes) == 0);
    CHECK(m.Find("no.such.tensor").entry == nullptr);
    CHECK(m.Find("no.such.tensor").data == nullptr);
    ManifestEntry foreign = e;
    foreign.alloc = 9;
    CHECK(m.CopyToHost(foreign, copy.data()).code() == Code::kInvalidArgument);
    // A moved mapping keeps working; the moved-from one is empty.
    MappedArena moved = std::move(m);
    CHECK(moved.Find(e.name).data == v.data);
    CHECK(m.size() == 0);  // NOLINT: checking the moved-from state on purpose
  }
}

namespace {

// Maps m (one allocation) on fd alone, first sized to `size` bytes unless
// size is 0; the map must fail: its error.
Error MapRefusal(const Manifest& m, UniqueFd fd, off_t size = 8192) {
  REQUIRE(fd.get() >= 0);
  if (size > 0) REQUIRE(::ftruncate(fd.get(), size) == 0);
  std::vector<UniqueFd> fds;
  fds.push_back(std::move(fd));
  auto r = MappedArena::Map(m, std::move(fds));
  REQUIRE_FALSE(r.ok());
  return r.error();
}

}  // namespace

TEST_CASE("Map refuses fds that do not match the manifest") {
  Manifest one = Good();
  one.allocations.pop_back();
  one.entries.pop_back();
  SECTION("wrong number of fds") {
    std::vector<UniqueFd> fds;
    fds.push_back(SealedMemfd(8192));
    fds.push_back(SealedMemfd(8192));
    auto r = MappedArena::Map(one, std::move(fds));
    REQUIRE_FALSE(r.ok());
    CHECK(Has(r.error().message(), "2 fds for 1 allocations"));
  }
  SECTION("an invalid fd") {
    std::vector<UniqueFd> fds(1);
    auto r = MappedArena::Map(one, std::move(fds));
    REQUIRE_FALSE(r.ok());
    CHECK(Has(r.error().message(), "arena allocation 0: no fd"));
  }
  SECTION("an unsealed memfd") {
    Error e = MapRefusal(one, UniqueFd(::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING)));
    CHECK(e.code() == Code::kRefused);
    CHECK(Has(e.message(), "not sealed"));
  }
  SECTION("a memfd smaller than the manifest says") {
    Error e = MapRefusal(one, SealedMemfd(4096), /*size=*/0);
    CHECK(e.code() == Code::kMismatch);
    CHECK(Has(e.message(), "holds 4096 bytes but the manifest says 8192"));
  }
  SECTION("a plain file") {
    test::TempDir dir;
    Error e = MapRefusal(one, UniqueFd(::open(dir.Join("f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)));
    CHECK(e.code() == Code::kRefused);
    CHECK(Has(e.message(), "not a memfd sealed read-only"));
  }
  SECTION("an inconsistent manifest") {
    Manifest bad = one;
    bad.entries[1].offset = 64;
    std::vector<UniqueFd> fds;
    fds.push_back(SealedMemfd(8192));
    auto r = MappedArena::Map(bad, std::move(fds));
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code() == Code::kCorrupt);
  }
  SECTION("a good one maps, zero-filled") {
    std::vector<UniqueFd> fds;
    fds.push_back(SealedMemfd(8192));
    auto r = MappedArena::Map(one, std::move(fds));
    REQUIRE(r.ok());
    auto v = r->Find("b");
    REQUIRE(v.data);
    CHECK(static_cast<const uint8_t*>(v.data)[0] == 0);
  }
}

// A sealed memfd whose byte i is i * 31 + 7 (mod 256).
UniqueFd PatternMemfd(uint64_t size) {
  int fd = ::memfd_create("wsup-table-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  std::vector<uint8_t> bytes(size);
  for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  REQUIRE(::write(fd, bytes.data(), size) == static_cast<ssize_t>(size));
  REQUIRE(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) == 0);
  return UniqueFd(fd);
}

// How many of this process's mappings are of the pattern memfd.
int PatternMappings() {
  auto maps = ReadFile("/proc/self/maps", 64 << 20);
  REQUIRE(maps.ok());
  int n = 0;
  for (size_t at = maps->find("wsup-table-test"); at != std::string::npos;
       at = maps->find("wsup-table-test", at + 1))
    ++n;
  return n;
}

// n entries of 256 bytes each, in layout order, in one allocation.
Manifest Many(size_t n) {
  Manifest m = test::HostManifest({{(n * 256 + 4095) / 4096 * 4096}});
  for (size_t i = 0; i < n; ++i) {
    m.entries.push_back({"model.layers." + std::to_string(i) + ".weight", "F32", {8, 8}, 0, i * 256, 256});
  }
  return m;
}

TEST_CASE("Map decodes a tensor table while it maps, and undoes the mapping when the table is bad") {
  for (size_t n : {size_t{2000}, size_t{10}}) {
    INFO(n << " entries");
    const Manifest full = Many(n);
    const std::string table = EncodeTensorTable(full.entries).value();
    auto header =
        ManifestFromJson(ManifestHeaderToJson(full, table.size()), table, ManifestDecoding::kHeaderOnly);
    REQUIRE(header.ok());
    CHECK(header->entries.empty());
    std::vector<UniqueFd> fds;
    fds.push_back(PatternMemfd(full.allocations[0].size));
    MapStats stats;
    auto m = MappedArena::Map(*header, std::move(fds), 0, &stats, table);
    REQUIRE(m.ok());
    CHECK(stats.overlapped == (n >= 512));  // a second thread only when there is enough to do
    CHECK(stats.decode_ms > 0);
    REQUIRE(m->size() == n);
    for (size_t i = 0; i < n; i += 97) {
      TensorView v = m->Find(full.entries[i].name);
      REQUIRE(v.entry == &m->manifest().entries[i]);
      CHECK(static_cast<const uint8_t*>(v.data)[0] == static_cast<uint8_t>(i * 256 * 31 + 7));
    }
    CHECK(m->Find("model.layers.x.weight").entry == nullptr);
  }

  // Failures on either side, with the other side fine: a clear error, and
  // nothing stays mapped.
  const Manifest full = Many(2000);
  const std::string good = EncodeTensorTable(full.entries).value();
  const Manifest header =
      ManifestFromJson(ManifestHeaderToJson(full, good.size()), good, ManifestDecoding::kHeaderOnly).value();
  auto dup = full.entries;
  dup[1999].name = dup[3].name;
  auto overlapping = full.entries;
  overlapping[1000].offset = 999 * 256;
  struct Case {
    const char* what;
    std::string table;
    bool sealed;
    std::vector<std::string> says;
  };
  std::string garbled = good;
  garbled[64 + 32 * 1500 + 27] = 9;  // record 1500: rank 9
  const std::vector<Case> cases = {
      {"a garbled record", garbled, true, {"tensor table: record 1500: rank 9", "restart the holder"}},
      {"a cut table", good.substr(0, good.size() - 1), true, {"tensor table:", "cut short"}},
      {"duplicate names",
       EncodeTensorTable(dup).value(),
       true,
       {"manifest entry 1999 ('model.layers.3.weight')", "duplicate of entry 3"}},
      {"overlapping entries",
       EncodeTensorTable(overlapping).value(),
       true,
       {"manifest entry 1000", "overlaps"}},
      {"an unsealed memfd", good, false, {"not sealed"}},
  };
  const int before = PatternMappings();
  for (const Case& c : cases) {
    INFO(c.what);
    std::vector<UniqueFd> fds;
    if (c.sealed) {
      fds.push_back(PatternMemfd(full.allocations[0].size));
    } else {
      int fd = ::memfd_create("wsup-table-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      REQUIRE(::ftruncate(fd, static_cast<off_t>(full.allocations[0].size)) == 0);
      fds.emplace_back(fd);
    }
    auto m = MappedArena::Map(header, std::move(fds), 0, nullptr, c.table);
    REQUIRE_FALSE(m.ok());
    for (const auto& s : c.says) {
      INFO(m.error().message());
      CHECK(Has(m.error().message(), s));
    }
    CHECK(PatternMappings() == before);
  }
  // A manifest may not bring entries and a table both.
  std::vector<UniqueFd> fds;
  fds.push_back(PatternMemfd(full.allocations[0].size));
  auto both = MappedArena::Map(full, std::move(fds), 0, nullptr, good);
  REQUIRE_FALSE(both.ok());
  CHECK(both.error().code() == Code::kInvalidArgument);
}

TEST_CASE("another process maps a host arena and reads it after the holder is SIGKILLed") {
  bool map_after_kill = GENERATE(false, true);
  INFO("map after kill: " << map_after_kill);
  HolderDiesWhileMapped("host", "llama-tiny-bf16-sharded", map_after_kill);
}

TEST_CASE("without a CUDA driver the cuda backend says so and how to proceed") {
  // A separate process, so the driver lookup happens fresh with the
  // library path pointing nowhere (the same as a machine without a driver).
  ::setenv("WSUP_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  auto r = test::Run({Peer(), "probe"}, 60s);
  ::unsetenv("WSUP_LIBCUDA");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  if (cuda::BuiltWithCuda()) {
    CHECK(Has(r.output,
              "cuda: unavailable: no CUDA driver (/nonexistent/libcuda.so.1 not found): use backend host, "
              "or run on a GPU node"));
  } else {
    CHECK(Has(r.output, "built without the CUDA toolkit headers"));
  }
  CHECK(Has(r.output, "load: unavailable:"));

  if (!NoGpuReason().empty()) {
    // No driver in this process either: mapping a cuda manifest is refused
    // the same way, before any fd is touched.
    Manifest m = Good();
    m.backend = "cuda";
    m.device = 0;
    m.device_uuid = "GPU-00000000-1111-2222-3333-444444444444";
    m.allocations = {{2 << 20}, {2 << 20}};
    std::vector<UniqueFd> fds;
    fds.push_back(SealedMemfd(4096));
    fds.push_back(SealedMemfd(4096));
    auto mapped = MappedArena::Map(m, std::move(fds));
    REQUIRE_FALSE(mapped.ok());
    CHECK(mapped.error().code() == Code::kUnavailable);
    CHECK(Has(mapped.error().message(), "use backend host"));
  }
}

TEST_CASE("cuda arenas load, map in this process and adopt from kept fds", "[gpu]") {
  WSUP_GPU_OR_SKIP();
  auto info = cuda::GetDeviceInfo(0);
  REQUIRE(info.ok());
  CHECK(info->uuid.rfind("GPU-", 0) == 0);
  CHECK(info->uuid.size() == 40);
  CHECK(info->cc_major >= 6);
  CHECK(info->vmm_supported);
  auto version = cuda::DriverVersion();
  REQUIRE(version.ok());
  CHECK(*version >= 11000);
  auto gran = cuda::VmmGranularity(0);
  REQUIRE(gran.ok());

  for (const char* name : kCheckpoints) {
    INFO(name);
    Manifest manifest;
    std::vector<UniqueFd> kept;
    {
      Arena arena = LoadArena(name, "cuda");
      manifest = arena.manifest();
      CHECK(manifest.backend == "cuda");
      CHECK(manifest.device == 0);
      CHECK(manifest.device_uuid == info->uuid);
      CHECK(manifest.allocations.size() == 1);
      for (const auto& a : manifest.allocations) CHECK(a.size % *gran == 0);
      MappedArena m = MapDups(arena);
      CHECK(m.is_cuda());
      CheckHashes(m, name);
      auto d = arena.DupFds();
      REQUIRE(d.ok());
      kept = std::move(*d);
    }
    // The arena and its mapping are gone; the kept fds alone hold the memory.
    auto adopted = Arena::Adopt(manifest, std::move(kept));
    if (!adopted.ok()) FAIL(adopted.error().ToString());
    MappedArena m = MapDups(*adopted);
    CheckHashes(m, name);

    Manifest bigger = manifest;
    bigger.allocations[0].size += *gran;
    auto d = adopted->DupFds();
    REQUIRE(d.ok());
    auto refused = Arena::Adopt(bigger, std::move(*d));
    CHECK_FALSE(refused.ok());

    Manifest elsewhere = manifest;
    elsewhere.device_uuid = "GPU-00000000-1111-2222-3333-444444444444";
    d = adopted->DupFds();
    REQUIRE(d.ok());
    auto wrong = MappedArena::Map(elsewhere, std::move(*d));
    REQUIRE_FALSE(wrong.ok());
    CHECK(wrong.error().code() == Code::kMismatch);
  }
}

TEST_CASE("an engine process keeps reading a cuda arena after its holder is SIGKILLed", "[gpu]") {
  WSUP_GPU_OR_SKIP();
  bool map_after_kill = GENERATE(false, true);
  INFO("map after kill: " << map_after_kill);
  for (const char* name : kCheckpoints) {
    INFO(name);
    HolderDiesWhileMapped("cuda", name, map_after_kill);
  }
}

TEST_CASE("a synthesized cuda arena splits at max_alloc_bytes and maps whole", "[gpu]") {
  WSUP_GPU_OR_SKIP();
  auto gran = cuda::VmmGranularity(0);
  REQUIRE(gran.ok());
  std::vector<ShardedTensor> ts;
  for (int i = 0; i < 300; ++i) {
    ShardedTensor t;
    t.name = "t";  // appended, not `"t" + ...`: GCC 12 -O3 gives a false -Wrestrict error on that
    t.name += std::to_string(i);
    t.dtype = DType::kBF16;
    t.shape = {i + 1, 4096};
    t.nbytes = static_cast<uint64_t>(i + 1) * 4096 * 2;
    ts.push_back(t);
  }
  LoadOptions opts;
  opts.backend = "cuda";
  opts.max_alloc_bytes = 8 * *gran;
  auto arena = Arena::Synthesize(ts, opts);
  if (!arena.ok()) FAIL(arena.error().ToString());
  CHECK(arena->manifest().allocations.size() > 3);
  MappedArena m = MapDups(*arena);
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < ts.size(); ++i) {
    auto v = m.Find(ts[i].name);
    REQUIRE(v.entry);
    buf.resize(v.entry->nbytes);
    REQUIRE(m.CopyToHost(*v.entry, buf.data()).ok());
    CHECK(std::count(buf.begin(), buf.end(), Arena::SyntheticByte(i)) == static_cast<long>(buf.size()));
  }
}

}  // namespace wsup

namespace wsup {

TEST_CASE("cuda loads of tensor-parallel slices hold exactly what ReadShard reads", "[gpu]") {
  WSUP_GPU_OR_SKIP();
  // 1 MiB chunks with several threads: pieces and strided column slices
  // straddle chunks, so partial rows, 2D copies and buffer reuse after an
  // event all run on the device.
  auto ck = Checkpoint::Open(test::TestData("llama-tiny-f32"));
  REQUIRE(ck.ok());
  for (int tp : {2, 4}) {
    for (int rank = 0; rank < tp; ++rank) {
      INFO("tp " << tp << " rank " << rank);
      auto shards = PlanShards(*ck, ShardSpec{tp, rank});
      REQUIRE(shards.ok());
      LoadOptions opts;
      opts.backend = "cuda";
      opts.staging_bytes = 1 << 20;
      opts.staging_buffers = 2;
      opts.read_threads = 3;
      LoadStats stats;
      auto arena = Arena::Load(*ck, *shards, opts, &stats);
      if (!arena.ok()) FAIL(arena.error().ToString());
      CHECK(stats.peak_staging_bytes <= 2u << 20);
      MappedArena m = MapDups(*arena);
      std::vector<uint8_t> want, got;
      for (const auto& s : *shards) {
        INFO(s.name);
        want.resize(s.nbytes);
        got.resize(s.nbytes);
        REQUIRE(ReadShard(*ck, s, want.data()).ok());
        auto v = m.Find(s.name);
        REQUIRE(v.entry);
        REQUIRE(m.CopyToHost(*v.entry, got.data()).ok());
        CHECK(want == got);
      }
    }
  }
}

}  // namespace wsup
