// Engine-made layouts on the cuda backend ([gpu]: skipped with a message
// where there is no GPU): a real `wsup-holder --layout engine --backend
// cuda`; a writer with several VMM grants written by host-to-device copies,
// committed, read by a second process; the writer's device pointers are the
// committed layout's; a writer process SIGKILLed mid-publish hands the lease
// on; the torch allocator entry points carve a cuda lease.
//
// Run on a GPU node: build/tests/holder_layout_cuda_test '[gpu]'
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "client/publish.h"
#include "client/wsup_client.h"
#include "common/sha256.h"
#include "gpu/cuda_driver.h"
#include "tests/gpu_skip.h"
#include "tests/holder/holder_fixture.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using test::Has, test::HolderProcess, test::StartHolder, test::TempDir;

#define WSUP_GPU_OR_SKIP() WSUP_GPU_SKIP_IF(test::NoGpuReason(), "holder_layout_cuda_test")

Fingerprint CudaFp(const std::string& revision = "r1") {
  return test::TestLayoutFp("cafe", revision, "vmm/v1", {{"backend", "cuda"}});
}

AttachOptions Opts(const HolderProcess& h, const std::string& name) {
  AttachOptions o = test::DaemonAttach(h, name, 30'000);
  o.device = 0;
  return o;
}

HolderProcess StartCudaLayoutHolder(const TempDir& dir) {
  HolderProcess h =
      StartHolder(dir, "cuda-layouts", {"--layout", "engine", "--backend", "cuda", "--device", "0"});
  INFO(h.Log());
  REQUIRE(h.WaitReady(60s));
  return h;
}

InfoMsg Info(const HolderProcess& h) {
  auto info = QueryHolderInfo(h.socket, 10'000);
  REQUIRE(info.ok());
  return *info;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

std::vector<uint8_t> DeviceBytes(const void* p, size_t n) {
  std::vector<uint8_t> v(n);
  Status st = cuda::CopyDtoH(v.data(), reinterpret_cast<cuda::DevicePtr>(p), n);
  if (!st.ok()) FAIL(st.error().ToString());
  return v;
}

// "tensor NAME SHA" lines of wsup-test-layout-writer read.
std::map<std::string, std::string> ReaderHashes(const std::string& output) {
  std::map<std::string, std::string> out;
  std::istringstream in(output);
  std::string word, name, sha;
  while (in >> word) {
    if (word == "tensor" && in >> name >> sha) out[name] = sha;
  }
  return out;
}

TEST_CASE(
    "cuda layouts: several VMM grants written, committed, read by another process - the writer's pointers "
    "are the layout's",
    "[gpu][layout]") {
  WSUP_GPU_OR_SKIP();
  TempDir dir;
  HolderProcess h = StartCudaLayoutHolder(dir);
  INFO(h.Log());
  InfoMsg info = Info(h);
  CHECK(info.layout == "engine");
  CHECK(info.fingerprint.Get("backend") == "cuda");
  auto gran = cuda::VmmGranularity(0);
  REQUIRE(gran.ok());
  auto ctx = cuda::PrimaryContext::Retain(0);
  REQUIRE(ctx.ok());
  REQUIRE(ctx->MakeCurrent().ok());

  auto first = AttachOrPublish(Opts(h, "cuda-writer"), CudaFp(), 0);
  INFO((first.ok() ? "" : first.error().ToString()));
  REQUIRE(first.ok());
  REQUIRE(first->publication != nullptr);
  Publication& pub = *first->publication;
  CHECK(pub.lease().backend == "cuda");
  CHECK(pub.lease().granularity == *gran);
  const uint64_t asks[] = {1000, 3 << 20, 5 << 20};
  std::vector<Publication::Region> regions;
  for (uint64_t ask : asks) {
    auto r = pub.Allocate(ask);
    INFO((r.ok() ? "" : r.error().ToString()));
    REQUIRE(r.ok());
    CHECK(r->size >= ask);
    CHECK(r->size % *gran == 0);
    regions.push_back(*r);
  }
  // One reserved range, grants mapped into it in order (as a reader maps them).
  CHECK(static_cast<char*>(regions[1].data) == static_cast<char*>(regions[0].data) + regions[0].size);
  CHECK(static_cast<char*>(regions[2].data) == static_cast<char*>(regions[1].data) + regions[1].size);
  CHECK(Info(h).layouts.at(0).allocations == 3);
  uint32_t alloc = 9;
  uint64_t offset = 0;
  REQUIRE(pub.Locate(static_cast<char*>(regions[1].data) + 12345, &alloc, &offset).ok());
  CHECK(alloc == 1);
  CHECK(offset == 12345);

  const auto a = Pattern(1000, 1), b = Pattern(3 << 20, 2), c = Pattern(5 << 20, 3), d = Pattern(4096, 4);
  REQUIRE(cuda::CopyHtoD(reinterpret_cast<cuda::DevicePtr>(regions[0].data), a.data(), a.size()).ok());
  REQUIRE(cuda::CopyHtoD(reinterpret_cast<cuda::DevicePtr>(regions[0].data) + 1024, d.data(), d.size()).ok());
  REQUIRE(cuda::CopyHtoD(reinterpret_cast<cuda::DevicePtr>(regions[1].data), b.data(), b.size()).ok());
  REQUIRE(cuda::CopyHtoD(reinterpret_cast<cuda::DevicePtr>(regions[2].data), c.data(), c.size()).ok());
  std::vector<ManifestEntry> entries = {
      {"a", "U8", {1000}, 0, 0, 1000},
      {"d", "U8", {4096}, 0, 1024, 4096},
      {"b", "U8", {3 << 20}, 1, 0, 3u << 20},
      {"c", "F32", {5 << 18}, 2, 0, 5u << 20},
  };
  // A bad commit first: refused, nothing moves.
  auto refused = pub.Commit({{"x", "U8", {4096}, 0, 0, 4096}, {"y", "U8", {4096}, 0, 2048, 4096}});
  REQUIRE_FALSE(refused.ok());
  CHECK(Has(refused.error().message(), "overlaps"));
  CHECK(pub.regions()[1].data == regions[1].data);

  auto committed = pub.Commit(entries);
  INFO((committed.ok() ? "" : committed.error().ToString()));
  REQUIRE(committed.ok());
  REQUIRE(committed->attachment != nullptr);
  const Attachment& mine = *committed->attachment;
  CHECK(mine.arena().is_cuda());
  CHECK(committed->outcome.source == WeightSource::kPublished);
  CHECK(mine.Find("a").data == regions[0].data);
  CHECK(mine.Find("d").data == static_cast<char*>(regions[0].data) + 1024);
  CHECK(mine.Find("b").data == regions[1].data);
  CHECK(mine.Find("c").data == regions[2].data);
  CHECK(DeviceBytes(regions[1].data, b.size()) == b);
  first->publication.reset();  // the layout's arena keeps the writer's mapping
  CHECK(DeviceBytes(mine.Find("c").data, c.size()) == c);

  InfoMsg after = Info(h);
  REQUIRE(after.layouts.size() == 1);
  CHECK(after.layouts[0].state == "committed");
  CHECK(after.layouts[0].tensors == 4);

  // Another process attaches and reads the same bytes.
  test::RunResult reader = test::Run(
      {test::BinPath("wsup-test-layout-writer"), "read", h.socket, CudaFp().ToJson().dump(), "0"}, 60s);
  INFO(reader.output);
  CHECK(reader.exit_code == 0);
  auto hashes = ReaderHashes(reader.output);
  CHECK(hashes["a"] == Sha256Hex(a.data(), a.size()));
  CHECK(hashes["d"] == Sha256Hex(d.data(), d.size()));
  CHECK(hashes["b"] == Sha256Hex(b.data(), b.size()));
  CHECK(hashes["c"] == Sha256Hex(c.data(), c.size()));

  // The holder dies; this process's mapping stays readable.
  h.child.Kill(SIGKILL);
  h.child.Wait(10s);
  CHECK(DeviceBytes(mine.Find("d").data, d.size()) == d);
}

TEST_CASE(
    "cuda layouts: a writer process SIGKILLed mid-publish releases its lease and its grant - the next "
    "client publishes",
    "[gpu][layout]") {
  WSUP_GPU_OR_SKIP();
  TempDir dir;
  HolderProcess h = StartCudaLayoutHolder(dir);
  INFO(h.Log());
  test::Child writer = test::Child::Start({test::BinPath("wsup-test-layout-writer"), "write", h.socket,
                                           CudaFp().ToJson().dump(), "0", std::to_string(8 << 20)},
                                          dir.Join("writer.log"));
  bool granted = test::WaitFor([&] { return Has(test::ReadAll(dir.Join("writer.log")), "granted"); }, 60s);
  INFO(test::ReadAll(dir.Join("writer.log")));
  REQUIRE(granted);
  InfoMsg during = Info(h);
  REQUIRE(during.layouts.size() == 1);
  CHECK(during.layouts[0].state == "writing");
  CHECK(during.layouts[0].writer == "layout-write");
  CHECK(during.layouts[0].arena_bytes >= (8u << 20));

  // A client that waits meanwhile, on its own thread: it gets the lease.
  Result<LayoutResult> next = Internal("not run");
  std::thread waiter([&] { next = AttachOrPublish(Opts(h, "heir"), CudaFp(), 30'000); });
  CHECK(test::WaitFor([&] { return Info(h).layouts.size() == 1 && Info(h).layouts[0].waiters == 1; }, 10s));
  writer.Kill(SIGKILL);
  CHECK(writer.Wait(10s) != -1);
  waiter.join();
  INFO((next.ok() ? "" : next.error().ToString()));
  REQUIRE(next.ok());
  REQUIRE(next->publication != nullptr);
  InfoMsg passed = Info(h);
  REQUIRE(passed.layouts.size() == 1);
  CHECK(passed.layouts[0].writer == "heir");
  CHECK(passed.layouts[0].arena_bytes == 0);  // the dead writer's grant is gone
  CHECK(Has(h.Log(), "disconnected before its commit"));

  auto ctx = cuda::PrimaryContext::Retain(0);
  REQUIRE(ctx.ok());
  REQUIRE(ctx->MakeCurrent().ok());
  auto region = next->publication->Allocate(4096);
  REQUIRE(region.ok());
  const auto bytes = Pattern(4096, 9);
  REQUIRE(cuda::CopyHtoD(reinterpret_cast<cuda::DevicePtr>(region->data), bytes.data(), bytes.size()).ok());
  auto committed = next->publication->Commit({{"w", "U8", {4096}, 0, 0, 4096}});
  REQUIRE(committed.ok());
  CHECK(DeviceBytes(committed->attachment->Find("w").data, 4096) == bytes);
  CHECK(Info(h).layouts.at(0).state == "committed");
}

TEST_CASE(
    "cuda layouts: the torch allocator entry points allocate, free and reuse inside the lease, and the "
    "commit names the blocks in place",
    "[gpu][layout][torch]") {
  WSUP_GPU_OR_SKIP();
  TempDir dir;
  HolderProcess h = StartCudaLayoutHolder(dir);
  INFO(h.Log());
  auto ctx = cuda::PrimaryContext::Retain(0);
  REQUIRE(ctx.ok());
  REQUIRE(ctx->MakeCurrent().ok());
  const std::string fp = CudaFp().ToJson().dump();
  wsup_attachment* w = wsup_publish_begin(h.socket.c_str(), "daemon", fp.c_str(), nullptr,
                                          R"({"client_name":"torch-writer","device":0,"wait_ms":0})");
  INFO(wsup_error(w));
  REQUIRE(wsup_has_lease(w) == 1);
  CHECK(wsup_is_cuda(w) == 1);
  REQUIRE(wsup_torch_set_chunk_bytes(4 << 20) == WSUP_OK);
  REQUIRE(wsup_publish_set_allocator_target(w) == WSUP_OK);

  auto* p1 = static_cast<char*>(wsup_torch_malloc(1000, 0, nullptr));
  auto* p2 = static_cast<char*>(wsup_torch_malloc(2 << 20, 0, nullptr));
  REQUIRE(p1 != nullptr);
  REQUIRE(p2 != nullptr);
  CHECK(p2 == p1 + 1024);
  uint32_t alloc = 9;
  uint64_t offset = 9;
  REQUIRE(wsup_publish_locate(w, p2, &alloc, &offset) == WSUP_OK);
  CHECK(alloc == 0);
  CHECK(offset == 1024);
  // Another device than the lease's: refused, with the reason.
  CHECK(wsup_torch_malloc(512, 1, nullptr) == nullptr);
  CHECK(Has(wsup_error(w), "the target lease's memory is on device 0"));
  // Freed and reused, first fit.
  wsup_torch_free(p1, 1000, 0, nullptr);
  auto* p3 = static_cast<char*>(wsup_torch_malloc(800, 0, nullptr));
  CHECK(p3 == p1);
  // Larger than the chunk: its own grant.
  auto* big = static_cast<char*>(wsup_torch_malloc(10 << 20, 0, nullptr));
  REQUIRE(big != nullptr);
  REQUIRE(wsup_publish_locate(w, big, &alloc, &offset) == WSUP_OK);
  CHECK(alloc == 1);
  CHECK(offset == 0);
  uint64_t granted = 0, used = 0, blocks = 0;
  REQUIRE(wsup_torch_usage(w, &granted, &used, &blocks) == WSUP_OK);
  CHECK(blocks == 3);
  CHECK(granted >= (14u << 20));

  const auto a = Pattern(2 << 20, 5), b = Pattern(10 << 20, 6);
  REQUIRE(cuda::CopyHtoD(reinterpret_cast<cuda::DevicePtr>(p2), a.data(), a.size()).ok());
  REQUIRE(cuda::CopyHtoD(reinterpret_cast<cuda::DevicePtr>(big), b.data(), b.size()).ok());
  REQUIRE(wsup_publish_commit(w, R"([{"name":"a","dtype":"U8","shape":[2097152],"alloc":0,"offset":1024},
                                     {"name":"big","dtype":"U8","shape":[10485760],"alloc":1,"offset":0}])") ==
          WSUP_OK);
  CHECK(wsup_is_cuda(w) == 1);
  CHECK(wsup_tensor_data(w, "a") == p2);
  CHECK(wsup_tensor_data(w, "big") == big);
  CHECK(wsup_torch_malloc(512, 0, nullptr) == nullptr);
  CHECK(Has(wsup_torch_last_error(), "the layout was committed"));

  wsup_attachment* r = wsup_attach(h.socket.c_str(), "daemon", fp.c_str(), nullptr, R"({"device":0})");
  INFO(wsup_error(r));
  REQUIRE(wsup_status(r) == WSUP_OK);
  CHECK(wsup_is_cuda(r) == 1);
  std::vector<uint8_t> got(10 << 20);
  REQUIRE(wsup_tensor_copy_to_host(r, "big", got.data(), got.size()) == WSUP_OK);
  CHECK(got == b);
  wsup_detach(r);

  // The handle goes while blocks are live: they stay mapped until freed.
  wsup_detach(w);
  CHECK(DeviceBytes(big, b.size()) == b);
  wsup_torch_free(p2, 0, 0, nullptr);
  wsup_torch_free(p3, 0, 0, nullptr);
  wsup_torch_free(big, 0, 0, nullptr);
  // Every free was taken: no failure since the last malloc's.
  CHECK(Has(wsup_torch_last_error(), "the layout was committed"));
  REQUIRE(wsup_torch_set_chunk_bytes(0) == WSUP_OK);
}

}  // namespace
}  // namespace wsup
