// wsup-test-arena-peer: plays a holder or an engine in a separate process for
// the arena tests, talking over the socket inherited as fd 3.
//
//   load <ckpt_dir> <backend> <device> <tp_size> <tp_rank>
//       loads the arena, sends its manifest JSON and fds, then waits for the
//       socket to close (the tests SIGKILL it while others hold the mapping).
//   map <device> <tensors.json>
//       receives a manifest and fds, maps them, says "mapped N", waits for
//       "go", then hashes every tensor against tensors.json and answers
//       "ok N" or "fail <what>"; exits 0 only when every hash matched.
//   probe
//       prints the CUDA driver's state in one line (for WSUP_LIBCUDA tests).
//
// A separate program (not a fork of the test) because a process that has
// initialised CUDA cannot use it in a forked child.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "client/mapping.h"
#include "common/fs.h"
#include "common/sha256.h"
#include "gpu/cuda_driver.h"
#include "holder/arena.h"
#include "testkit/fd_channel.h"

namespace wsup {
namespace {

constexpr int kSock = 3;

int Fail(const std::string& what) {
  std::fprintf(stderr, "arena-peer: %s\n", what.c_str());
  (void)test::SendMessage(kSock, "fail " + what);
  return 1;
}

int Load(const std::string& dir, const std::string& backend, int device, int tp, int rank) {
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return Fail(ckpt.error().ToString());
  auto shards = PlanShards(*ckpt, ShardSpec{tp, rank});
  if (!shards.ok()) return Fail(shards.error().ToString());
  LoadOptions opts;
  opts.backend = backend;
  opts.device = device;
  auto arena = Arena::Load(*ckpt, *shards, opts);
  if (!arena.ok()) return Fail(arena.error().ToString());
  std::vector<int> fds;
  for (const auto& fd : arena->fds()) fds.push_back(fd.get());
  Status st = test::SendMessage(kSock, ManifestToJson(arena->manifest()).dump(), fds);
  if (!st.ok()) return Fail(st.ToString());
  // Hold the arena until the test closes the socket or kills us.
  char c;
  while (::read(kSock, &c, 1) > 0) {
  }
  return 0;
}

int Map(int device, const std::string& tensors_json) {
  std::string payload;
  std::vector<UniqueFd> fds;
  Status st = test::RecvMessage(kSock, &payload, &fds);
  if (!st.ok()) return Fail(st.ToString());
  nlohmann::json j = nlohmann::json::parse(payload, nullptr, false);
  if (j.is_discarded()) return Fail("manifest is not JSON: " + payload.substr(0, 200));
  auto manifest = ManifestFromJson(j);
  if (!manifest.ok()) return Fail(manifest.error().ToString());
  auto mapped = MappedArena::Map(std::move(*manifest), std::move(fds), device);
  if (!mapped.ok()) return Fail(mapped.error().ToString());
  st = test::SendMessage(kSock, "mapped " + std::to_string(mapped->size()));
  if (!st.ok()) return Fail(st.ToString());
  if (!(st = test::RecvMessage(kSock, &payload, nullptr)).ok()) return Fail(st.ToString());
  if (payload != "go") return Fail("expected 'go', got '" + payload + "'");

  auto text = ReadFile(tensors_json);
  if (!text.ok()) return Fail(text.error().ToString());
  nlohmann::json expect = nlohmann::json::parse(*text, nullptr, false);
  if (!expect.is_object()) return Fail(tensors_json + ": not a JSON object");
  if (expect.size() != mapped->size()) {
    return Fail("arena has " + std::to_string(mapped->size()) + " tensors, " + tensors_json + " lists " +
                std::to_string(expect.size()));
  }
  std::vector<uint8_t> buf;
  for (const auto& e : mapped->manifest().entries) {
    auto it = expect.find(e.name);
    if (it == expect.end()) return Fail("tensor '" + e.name + "' is not in " + tensors_json);
    auto view = mapped->Find(e.name);
    if (!view.entry || !view.data) return Fail("Find('" + e.name + "') found nothing");
    buf.resize(e.nbytes);
    st = mapped->CopyToHost(e, buf.data());
    if (!st.ok()) return Fail(st.ToString());
    std::string got = Sha256Hex(buf.data(), buf.size());
    if (got != (*it)["sha256"].get<std::string>()) return Fail("tensor '" + e.name + "' hashes to " + got);
  }
  (void)test::SendMessage(kSock, "ok " + std::to_string(mapped->size()));
  return 0;
}

int Probe() {
  Status st = cuda::Init();
  if (st.ok()) {
    auto n = cuda::DeviceCount();
    std::printf("cuda: ok %d\n", n.ok() ? *n : -1);
  } else {
    std::printf("cuda: %s\n", st.ToString().c_str());
  }
  // And what a cuda load says, which is what an operator sees.
  LoadOptions opts;
  opts.backend = "cuda";
  auto arena = Arena::Synthesize({}, opts);
  std::printf("load: %s\n", arena.ok() ? "ok" : arena.error().ToString().c_str());
  return 0;
}

}  // namespace
}  // namespace wsup

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  if (a.size() == 6 && a[0] == "load") {
    return wsup::Load(a[1], a[2], std::stoi(a[3]), std::stoi(a[4]), std::stoi(a[5]));
  }
  if (a.size() == 3 && a[0] == "map") return wsup::Map(std::stoi(a[1]), a[2]);
  if (a.size() == 1 && a[0] == "probe") return wsup::Probe();
  std::fprintf(stderr,
               "usage: %s load <ckpt_dir> <host|cuda> <device> <tp_size> <tp_rank>\n"
               "       %s map <device> <tensors.json>\n"
               "       %s probe\n",
               argv[0], argv[0], argv[0]);
  return 2;
}
