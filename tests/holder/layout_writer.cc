// wsup-test-layout-writer: the other process of the engine-made layout
// tests (tests/holder/layout_cuda_test.cc), a writer or a reader of a
// holder started with --layout engine.
//
//   wsup-test-layout-writer write SOCKET FINGERPRINT_JSON DEVICE BYTES
//     takes the lease, allocates BYTES (mapped on cuda DEVICE for a cuda
//     holder), fills them with byte i = i * 7 + 3, prints "granted SIZE"
//     and then waits for good without committing, for the test to kill.
//   wsup-test-layout-writer read SOCKET FINGERPRINT_JSON DEVICE
//     attaches the committed layout and prints "tensor NAME SHA256" for
//     each tensor, then "done"; exits 0.
// Anything else, or any failure: a message on stderr, exit 1.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/publish.h"
#include "common/sha256.h"
#include "gpu/cuda_driver.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "wsup-test-layout-writer: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace wsup;
  if (argc < 5)
    return Fail("usage: write SOCKET FINGERPRINT_JSON DEVICE BYTES | read SOCKET FINGERPRINT_JSON DEVICE");
  const std::string mode = argv[1];
  AttachOptions o;
  o.socket_path = argv[2];
  o.mode = AttachMode::kDaemon;
  o.client_name = "layout-" + mode;
  o.device = std::atoi(argv[4]);
  auto j = nlohmann::json::parse(argv[3], nullptr, false);
  if (j.is_discarded()) return Fail("the fingerprint is not JSON");
  auto fp = Fingerprint::FromJson(j);
  if (!fp.ok()) return Fail(fp.error().ToString());

  if (mode == "write" && argc == 6) {
    auto r = AttachOrPublish(o, *fp, 0);
    if (!r.ok()) return Fail(r.error().ToString());
    if (!r->publication) return Fail("no lease: " + r->outcome.reason);
    auto region = r->publication->Allocate(std::strtoull(argv[5], nullptr, 10));
    if (!region.ok()) return Fail(region.error().ToString());
    std::vector<uint8_t> bytes(region->size);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
    if (r->publication->lease().backend == "cuda") {
      auto ctx = cuda::PrimaryContext::Retain(o.device);
      if (!ctx.ok()) return Fail(ctx.error().ToString());
      Status cur = ctx->MakeCurrent();
      if (!cur.ok()) return Fail(cur.error().ToString());
      Status copied =
          cuda::CopyHtoD(reinterpret_cast<cuda::DevicePtr>(region->data), bytes.data(), bytes.size());
      if (!copied.ok()) return Fail(copied.error().ToString());
    } else {
      std::copy(bytes.begin(), bytes.end(), static_cast<uint8_t*>(region->data));
    }
    std::printf("granted %llu\n", static_cast<unsigned long long>(region->size));
    std::fflush(stdout);
    for (;;) ::pause();  // the test kills this writer mid-publish
  }
  if (mode == "read" && argc == 5) {
    auto r = Attach(o, *fp);
    if (!r.ok()) return Fail(r.error().ToString());
    if (!r->attachment) return Fail("not attached: " + r->outcome.reason);
    for (const ManifestEntry& e : r->attachment->manifest().entries) {
      std::vector<uint8_t> host(e.nbytes);
      Status st = r->attachment->arena().CopyToHost(e, host.data());
      if (!st.ok()) return Fail(st.error().ToString());
      std::printf("tensor %s %s\n", e.name.c_str(), Sha256Hex(host.data(), host.size()).c_str());
    }
    std::printf("done\n");
    return 0;
  }
  return Fail("unknown mode or arguments: " + mode);
}
