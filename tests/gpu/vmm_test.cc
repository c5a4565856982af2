// VmmHandle and VmmRange give back exactly what they made, once: on
// destruction, on Reset, after moves, and when a MapAll fails half-way.
// The fake driver below counts live handles, reservations and mappings; the
// last case runs the same path on a real GPU.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <set>
#include <string>
#include <utility>

#include "gpu/cuda_driver.h"
#include "gpu/vmm.h"
#include "tests/gpu_skip.h"

namespace wsup::cuda {
namespace {

// Hands out numbers, keeps what is live, and fails the call it is told to.
class FakeVmm final : public VmmOps {
 public:
  Result<MemHandle> Create(int device, uint64_t size) override {
    if (fail_create) return Unavailable("fake: out of memory");
    live_handles.insert(next_);
    return next_++;
  }
  Result<MemHandle> Import(int fd) override {
    live_handles.insert(next_);
    return next_++;
  }
  Result<UniqueFd> Export(MemHandle handle) override {
    if (!live_handles.count(handle)) return Internal("fake: export of a dead handle");
    return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
  Status Release(MemHandle handle) override {
    ++releases;
    if (live_handles.erase(handle) != 1) ++double_frees;
    return Status::Ok();
  }
  Result<DevicePtr> Reserve(uint64_t size, uint64_t alignment) override {
    if (fail_reserve) return Unavailable("fake: no address space");
    DevicePtr p = next_va_;
    next_va_ += size + (1 << 20);
    live_ranges[p] = size;
    return p;
  }
  Status Free(DevicePtr ptr, uint64_t size) override {
    auto it = live_ranges.find(ptr);
    if (it == live_ranges.end() || it->second != size) {
      ++double_frees;
      return Internal("fake: free of an unknown range");
    }
    for (const auto& [at, m] : live_maps) {
      if (at >= ptr && at < ptr + size) ++freed_while_mapped;
    }
    live_ranges.erase(it);
    return Status::Ok();
  }
  Status Map(DevicePtr ptr, uint64_t size, MemHandle handle) override {
    if (++maps == fail_map_at) return Unavailable("fake: map refused");
    if (!live_handles.count(handle)) return Internal("fake: map of a dead handle");
    live_maps[ptr] = size;
    return Status::Ok();
  }
  Status Unmap(DevicePtr ptr, uint64_t size) override {
    ++unmaps;
    uint64_t covered = 0;
    for (auto it = live_maps.lower_bound(ptr); it != live_maps.end() && it->first < ptr + size;) {
      covered += it->second;
      it = live_maps.erase(it);
    }
    if (covered != size) ++double_frees;
    return Status::Ok();
  }
  Status SetAccess(DevicePtr ptr, uint64_t size, int device) override {
    if (fail_access) return Unavailable("fake: access refused");
    return Status::Ok();
  }

  bool nothing_live() const { return live_handles.empty() && live_ranges.empty() && live_maps.empty(); }

  std::set<MemHandle> live_handles;
  std::map<DevicePtr, uint64_t> live_ranges;
  std::map<DevicePtr, uint64_t> live_maps;
  int releases = 0, unmaps = 0, maps = 0, double_frees = 0, freed_while_mapped = 0;
  int fail_map_at = -1;
  bool fail_create = false, fail_reserve = false, fail_access = false;

 private:
  MemHandle next_ = 1;
  DevicePtr next_va_ = 1 << 30;
};

TEST_CASE("a VmmHandle releases its handle once, on destruction or Reset, and moves") {
  FakeVmm fake;
  {
    auto h = VmmHandle::Create(0, 2 << 20, fake);
    REQUIRE(h.ok());
    REQUIRE(h->valid());
    REQUIRE(fake.live_handles.size() == 1);
    VmmHandle moved = std::move(*h);
    CHECK(!h->valid());
    VmmHandle assigned;
    assigned = std::move(moved);
    CHECK(!moved.valid());
    CHECK(assigned.valid());
    auto fd = assigned.Export();
    REQUIRE(fd.ok());
    CHECK(fd->valid());
    CHECK(fake.releases == 0);
  }
  CHECK(fake.releases == 1);
  CHECK(fake.nothing_live());

  auto h = VmmHandle::Import(7, fake);
  REQUIRE(h.ok());
  CHECK(h->Reset().ok());
  CHECK(h->Reset().ok());
  CHECK(!h->valid());
  CHECK(!h->Export().ok());
  CHECK(fake.releases == 2);
  CHECK(fake.double_frees == 0);

  // Assigning over a live handle releases the old one first.
  auto a = VmmHandle::Create(0, 2 << 20, fake);
  auto b = VmmHandle::Create(0, 2 << 20, fake);
  REQUIRE((a.ok() && b.ok()));
  const MemHandle kept = b->get();
  *a = std::move(*b);
  CHECK(fake.live_handles == std::set<MemHandle>{kept});
  fake.fail_create = true;
  CHECK(!VmmHandle::Create(0, 2 << 20, fake).ok());
}

TEST_CASE("a VmmRange unmaps what it mapped and frees its reservation, once") {
  FakeVmm fake;
  auto h1 = VmmHandle::Create(0, 2 << 20, fake);
  auto h2 = VmmHandle::Create(0, 2 << 20, fake);
  REQUIRE((h1.ok() && h2.ok()));
  {
    auto r = VmmRange::Reserve(4 << 20, 2 << 20, fake);
    REQUIRE(r.ok());
    REQUIRE(r->Map(0, 2 << 20, h1->get()).ok());
    REQUIRE(r->Map(2 << 20, 2 << 20, h2->get()).ok());
    CHECK(!r->Map(4 << 20, 1, h2->get()).ok());  // past the end: refused before the driver
    CHECK(r->SetAccess(0, 4 << 20, 0).ok());
    CHECK(r->mappings() == 2);
    // The mappings keep the memory: the handles may go now.
    CHECK(h1->Reset().ok());
    CHECK(h2->Reset().ok());
    VmmRange moved = std::move(*r);
    CHECK(!r->valid());
    CHECK(r->base() == 0);
    CHECK(moved.mappings() == 2);
    CHECK(fake.live_maps.size() == 2);
  }
  CHECK(fake.unmaps == 2);
  CHECK(fake.nothing_live());
  CHECK(fake.double_frees == 0);
  CHECK(fake.freed_while_mapped == 0);
}

TEST_CASE("a VmmRange unmaps a span of mappings with one call and keeps its reservation") {
  FakeVmm fake;
  auto h = VmmHandle::Create(0, 2 << 20, fake);
  REQUIRE(h.ok());
  auto r = VmmRange::Reserve(8 << 20, 2 << 20, fake);
  REQUIRE(r.ok());
  REQUIRE(r->Map(0, 2 << 20, h->get()).ok());
  REQUIRE(r->Map(2 << 20, 2 << 20, h->get()).ok());
  REQUIRE(r->Map(6 << 20, 2 << 20, h->get()).ok());
  CHECK(r->Unmap(0, 4 << 20).ok());
  CHECK(fake.unmaps == 1);
  CHECK(r->mappings() == 1);
  CHECK(fake.live_ranges.size() == 1);
  // Mapping again after an unmap is allowed (a KV pool comes and goes).
  REQUIRE(r->Map(0, 2 << 20, h->get()).ok());
  CHECK(r->UnmapAll().ok());
  CHECK(r->mappings() == 0);
  CHECK(fake.live_maps.empty());
  CHECK(fake.live_ranges.size() == 1);
  CHECK(r->Reset().ok());
  CHECK(r->Reset().ok());
  CHECK(fake.live_ranges.empty());
  CHECK(fake.double_frees == 0);
}

// n handles of 2 MiB made on fake: their owners, and the raw handles that
// MapAll takes.
struct Handles {
  std::vector<VmmHandle> owned;
  std::vector<MemHandle> handles;
};
Handles MakeHandles(FakeVmm& fake, int n) {
  Handles out;
  for (int i = 0; i < n; ++i) {
    auto h = VmmHandle::Create(0, 2 << 20, fake);
    REQUIRE(h.ok());
    out.handles.push_back(h->get());
    out.owned.push_back(std::move(*h));
  }
  return out;
}

TEST_CASE("MapAll maps every handle back to back and grants access to the whole range") {
  FakeVmm fake;
  auto [owned, handles] = MakeHandles(fake, 3);
  auto r = VmmRange::MapAll({2 << 20, 4 << 20, 2 << 20}, handles, 2 << 20, 0, "allocation", fake);
  REQUIRE(r.ok());
  CHECK(r->size() == (8u << 20));
  CHECK(r->mappings() == 3);
  CHECK(fake.live_maps.count(r->base() + (6 << 20)) == 1);
  CHECK(!VmmRange::MapAll({2 << 20}, handles, 2 << 20, 0, "allocation", fake).ok());
}

TEST_CASE("a MapAll that fails half-way leaves nothing mapped or reserved") {
  for (int fail_at : {1, 2, 3}) {
    FakeVmm fake;
    auto [owned, handles] = MakeHandles(fake, 3);
    fake.fail_map_at = fail_at;
    auto r = VmmRange::MapAll({2 << 20, 2 << 20, 2 << 20}, handles, 2 << 20, 0, "allocation", fake);
    REQUIRE(!r.ok());
    CHECK(r.error().message().find("allocation " + std::to_string(fail_at - 1)) != std::string::npos);
    CHECK(fake.live_maps.empty());
    CHECK(fake.live_ranges.empty());
    CHECK(fake.unmaps == fail_at - 1);
    owned.clear();
    CHECK(fake.nothing_live());
    CHECK(fake.double_frees == 0);
  }
  FakeVmm fake;
  auto h = VmmHandle::Create(0, 2 << 20, fake);
  REQUIRE(h.ok());
  fake.fail_access = true;
  CHECK(!VmmRange::MapAll({2 << 20}, {h->get()}, 2 << 20, 0, "allocation", fake).ok());
  CHECK(fake.live_maps.empty());
  CHECK(fake.live_ranges.empty());
  fake.fail_access = false;
  fake.fail_reserve = true;
  CHECK(!VmmRange::MapAll({2 << 20}, {h->get()}, 2 << 20, 0, "allocation", fake).ok());
  CHECK(fake.live_ranges.empty());
}

TEST_CASE("the owners on a real GPU: export, import, map, and a failed map leaves nothing", "[gpu]") {
  WSUP_GPU_SKIP_IF(wsup::test::NoGpuReason(), "gpu_vmm_test");
  auto ctx = PrimaryContext::Retain(0);
  REQUIRE(ctx.ok());
  ContextScope scope;
  REQUIRE(scope.Enter(*ctx).ok());
  auto gran = VmmGranularity(0);
  REQUIRE(gran.ok());
  auto made = VmmHandle::Create(0, *gran);
  REQUIRE(made.ok());
  auto fd = made->Export();
  REQUIRE(fd.ok());
  REQUIRE(made->Reset().ok());  // the fd keeps the memory
  auto imported = VmmHandle::Import(fd->get());
  REQUIRE(imported.ok());
  {
    auto r = VmmRange::MapAll({*gran}, {imported->get()}, *gran, 0, "allocation");
    REQUIRE(r.ok());
    const uint32_t word = 0x5eed5eed;
    REQUIRE(CopyHtoD(r->base(), &word, sizeof word).ok());
    uint32_t back = 0;
    REQUIRE(CopyDtoH(&back, r->base(), sizeof back).ok());
    CHECK(back == word);
    REQUIRE(ContextSynchronize().ok());
  }
  // Twice the size of the memory cannot be mapped: the range goes with the error.
  auto bad = VmmRange::MapAll({2 * *gran}, {imported->get()}, *gran, 0, "allocation");
  CHECK(!bad.ok());
}

}  // namespace
}  // namespace wsup::cuda
