// wsup-bench-attach: what a cold load and an attach cost, in one run.
//
//   (a) load: Arena::Load of a checkpoint (GB/s, staging, peak RSS), or a
//       synthetic arena of N tensors made without disk (--synthetic);
//       optionally a dd-like O_DIRECT read of the same files first
//       (--baseline), the bar the loader is held to;
//   (b) attach through fds: a fresh process asks for the arena, receives the
//       manifest and one fd per allocation over a socketpair, maps them and
//       builds its name table; timed from its request to every tensor
//       addressable;
//   (c) attach through legacy CUDA IPC: the same tensors as one cuMemAlloc
//       buffer each, opened in a fresh process with one cuIpcOpenMemHandle
//       per tensor (cuda only).
// Fresh processes are this program re-executed (--child), since a process
// that has initialised CUDA cannot use it in a forked child.
//
//   wsup-bench-attach --checkpoint DIR [--tp 2 --rank 0] [--backend cuda] [--baseline]
//   wsup-bench-attach --synthetic 20000 --total-bytes 96G [--backend cuda]
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/cuda_driver.h"
#include "client/manifest.h"
#include "client/mapping.h"
#include "holder/arena.h"
#include "holder/checkpoint.h"
#include "holder/sharding.h"
#include "tests/client/fd_channel.h"

namespace wsup {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kChildSock = 3;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

Result<uint64_t> ParseBytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suffix = end ? end : "";
  uint64_t mult = 1;
  if (suffix == "K" || suffix == "KiB")
    mult = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB")
    mult = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB")
    mult = 1ull << 30;
  else if (suffix == "T" || suffix == "TiB")
    mult = 1ull << 40;
  else if (!suffix.empty())
    return InvalidArgument("size '" + s + "': use a number with K, M, G or T");
  if (!(v > 0)) return InvalidArgument("size '" + s + "' must be positive");
  return static_cast<uint64_t>(v * static_cast<double>(mult));
}

uint64_t PeakRssBytes() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "wsup-bench-attach: %s\n", what.c_str());
  std::exit(1);
}

// --- the fresh processes ---

// Asks the parent for the arena and times the way to a full name table.
int ChildFd(int device) {
  nlohmann::json out;
  auto t_init = Clock::now();
  cuda::PrimaryContext ctx;
  bool want_cuda = device >= 0;
  if (want_cuda) {
    auto c = cuda::PrimaryContext::Retain(device);
    if (!c.ok()) Die(c.error().ToString());
    ctx = std::move(*c);
    if (Status st = ctx.MakeCurrent(); !st.ok()) Die(st.ToString());
  }
  auto t0 = Clock::now();
  if (Status st = test::SendMessage(kChildSock, "attach"); !st.ok()) Die(st.ToString());
  std::string payload;
  std::vector<UniqueFd> fds;
  if (Status st = test::RecvMessage(kChildSock, &payload, &fds); !st.ok()) Die(st.ToString());
  auto t_recv = Clock::now();
  auto j = nlohmann::json::parse(payload, nullptr, false);
  auto t_parse = Clock::now();
  auto manifest = ManifestFromJson(j);
  if (!manifest.ok()) Die(manifest.error().ToString());
  auto t_manifest = Clock::now();
  auto mapped = MappedArena::Map(std::move(*manifest), std::move(fds), device < 0 ? 0 : device);
  if (!mapped.ok()) Die(mapped.error().ToString());
  auto t1 = Clock::now();
  out["recv_ms"] = Ms(t0, t_recv);
  out["json_parse_ms"] = Ms(t_recv, t_parse);
  out["manifest_ms"] = Ms(t_parse, t_manifest);
  out["map_ms"] = Ms(t_manifest, t1);
  out["manifest_bytes"] = payload.size();
  // Outside the timing: every tensor is found and a sample reads right.
  size_t found = 0;
  for (const auto& e : mapped->manifest().entries) found += mapped->Find(e.name).data != nullptr;
  out["init_ms"] = Ms(t_init, t0);
  out["attach_ms"] = Ms(t0, t1);
  out["tensors"] = mapped->size();
  out["found"] = found;
  out["allocations"] = mapped->manifest().allocations.size();
  (void)test::SendMessage(kChildSock, out.dump());
  return found == mapped->size() ? 0 : 1;
}

int ChildIpc(int device) {
  nlohmann::json out;
  auto t_init = Clock::now();
  auto ctx = cuda::PrimaryContext::Retain(device);
  if (!ctx.ok()) Die(ctx.error().ToString());
  if (Status st = ctx->MakeCurrent(); !st.ok()) Die(st.ToString());
  auto t0 = Clock::now();
  if (Status st = test::SendMessage(kChildSock, "attach"); !st.ok()) Die(st.ToString());
  std::string payload;
  if (Status st = test::RecvMessage(kChildSock, &payload, nullptr); !st.ok()) Die(st.ToString());
  // payload: u32 name length, name, u64 nbytes, 64-byte handle; repeated.
  std::unordered_map<std::string, std::pair<cuda::DevicePtr, uint64_t>> table;
  size_t off = 0;
  while (off < payload.size()) {
    uint32_t len;
    std::memcpy(&len, payload.data() + off, 4);
    off += 4;
    std::string name = payload.substr(off, len);
    off += len;
    uint64_t nbytes;
    std::memcpy(&nbytes, payload.data() + off, 8);
    off += 8;
    cuda::IpcHandle h;
    std::memcpy(h.data(), payload.data() + off, h.size());
    off += h.size();
    auto p = cuda::IpcOpenMemHandle(h);
    if (!p.ok()) Die(p.error().With("tensor '" + name + "'").ToString());
    table.emplace(std::move(name), std::make_pair(*p, nbytes));
  }
  auto t1 = Clock::now();
  out["init_ms"] = Ms(t_init, t0);
  out["attach_ms"] = Ms(t0, t1);
  out["tensors"] = table.size();
  for (auto& [name, p] : table) (void)cuda::IpcCloseMemHandle(p.first);
  (void)test::SendMessage(kChildSock, out.dump());
  return 0;
}

// --- the parent ---

struct Spawned {
  pid_t pid = -1;
  UniqueFd sock;
};

Spawned SpawnChild(const std::string& mode, int device) {
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) Die("readlink /proc/self/exe failed");
  exe[n] = '\0';
  auto pair = test::SocketPair();
  if (!pair.ok()) Die(pair.error().ToString());
  std::string dev = std::to_string(device);
  pid_t pid = ::fork();
  if (pid < 0) Die("fork failed");
  if (pid == 0) {
    int fd = pair->second.get();
    if (fd == kChildSock) {
      ::fcntl(fd, F_SETFD, 0);
    } else {
      ::dup2(fd, kChildSock);
    }
    ::execl(exe, exe, "--child", mode.c_str(), dev.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  Spawned s;
  s.pid = pid;
  s.sock = std::move(pair->first);
  return s;
}

// Serves one attach request and returns the child's report.
nlohmann::json Serve(Spawned& child, const std::string& payload, const std::vector<int>& fds) {
  std::string req;
  if (Status st = test::RecvMessage(child.sock.get(), &req, nullptr, std::chrono::minutes(5)); !st.ok()) {
    Die("child: " + st.ToString());
  }
  if (Status st = test::SendMessage(child.sock.get(), payload, fds); !st.ok()) Die(st.ToString());
  std::string report;
  if (Status st = test::RecvMessage(child.sock.get(), &report, nullptr, std::chrono::minutes(10)); !st.ok()) {
    Die("child: " + st.ToString());
  }
  int status = 0;
  ::waitpid(child.pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("child failed: " + report);
  return nlohmann::json::parse(report);
}

// dd-like: every file once, O_DIRECT, 64 MiB reads, one thread.
double BaselineGbps(const Checkpoint& ck, uint64_t* total) {
  const size_t bs = 64u << 20;
  void* buf = nullptr;
  if (::posix_memalign(&buf, 4096, bs) != 0) Die("posix_memalign");
  auto t0 = Clock::now();
  *total = 0;
  for (const auto& f : ck.files()) {
    int fd = ::open(f.path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Die("open " + f.path);
    for (;;) {
      ssize_t n = ::read(fd, buf, bs);
      if (n <= 0) break;
      *total += static_cast<uint64_t>(n);
    }
    ::close(fd);
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::free(buf);
  return static_cast<double>(*total) / s / 1e9;
}

// Maps the arena in this process and compares every tensor's bytes with
// what ReadShard reads from the checkpoint.
Status VerifyAgainstCheckpoint(const Arena& arena, const Checkpoint& ck,
                               const std::vector<ShardedTensor>& tensors) {
  WSUP_ASSIGN_OR_RETURN(std::vector<UniqueFd> fds, arena.DupFds());
  WSUP_ASSIGN_OR_RETURN(MappedArena m,
                        MappedArena::Map(arena.manifest(), std::move(fds), arena.manifest().device));
  std::vector<uint8_t> want, got;
  for (const auto& t : tensors) {
    auto v = m.Find(t.name);
    if (!v.entry) return Internal("tensor '" + t.name + "' is missing from the arena");
    want.resize(t.nbytes);
    got.resize(t.nbytes);
    WSUP_RETURN_IF_ERROR(ReadShard(ck, t, want.data()));
    WSUP_RETURN_IF_ERROR(m.CopyToHost(*v.entry, got.data()));
    if (want != got) return Internal("tensor '" + t.name + "' differs from the checkpoint");
  }
  return {};
}

void Row(const char* step, const std::string& time, const std::string& detail) {
  std::printf("%-34s %-12s %s\n", step, time.c_str(), detail.c_str());
}

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

int Main(int argc, char** argv) {
  CLI::App app{"wsup-bench-attach: cold load and attach cost of an arena"};
  std::string checkpoint, backend = "cuda", total_str = "1G";
  int tp = 1, rank = 0, device = 0, synthetic = 0;
  LoadOptions opts;
  uint64_t staging_mb = opts.staging_bytes >> 20;
  bool baseline = false, no_direct = false, skip_ipc = false, json_out = false, verify = false;
  app.add_option("--checkpoint", checkpoint, "checkpoint folder to load");
  app.add_option("--synthetic", synthetic, "instead: synthesize this many tensors without disk");
  app.add_option("--total-bytes", total_str, "synthetic arena size, e.g. 96G");
  app.add_option("--tp", tp, "tensor-parallel size");
  app.add_option("--rank", rank, "tensor-parallel rank");
  app.add_option("--backend", backend, "host or cuda")->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--device", device, "cuda ordinal");
  app.add_option("--read-threads", opts.read_threads, "parallel file readers");
  app.add_option("--staging-mb", staging_mb, "size of each staging buffer in MiB");
  app.add_option("--staging-buffers", opts.staging_buffers, "staging buffers in flight");
  app.add_flag("--baseline", baseline, "first read the files dd-like (O_DIRECT, 64 MiB, one thread)");
  app.add_flag("--no-direct", no_direct, "load with buffered reads only");
  app.add_flag("--skip-ipc", skip_ipc, "skip the legacy cuIpcOpenMemHandle comparison");
  app.add_flag("--json", json_out, "also print the results as one JSON line");
  app.add_flag("--verify", verify, "after loading, compare every tensor with ReadShard (checkpoint mode)");
  CLI11_PARSE(app, argc, argv);
  if (checkpoint.empty() == (synthetic == 0)) Die("give --checkpoint DIR or --synthetic N (one of them)");
  opts.backend = backend;
  opts.device = device;
  opts.staging_bytes = staging_mb << 20;
  opts.direct_io = !no_direct;
  const bool is_cuda = backend == "cuda";
  nlohmann::json results;

  std::string where = "host";
  if (is_cuda) {
    auto info = cuda::GetDeviceInfo(device);
    if (!info.ok()) Die(info.error().ToString());
    auto ver = cuda::DriverVersion();
    where = "cuda device " + std::to_string(device) + " (" + info->name + ", " + info->uuid +
            ", driver CUDA " + (ver.ok() ? cuda::VersionString(*ver) : "?") + ")";
  }

  // (a) load
  std::vector<ShardedTensor> tensors;
  std::optional<Checkpoint> ck;
  LoadStats stats;
  std::optional<Arena> arena;
  double baseline_gbps = 0;
  uint64_t baseline_bytes = 0;
  if (!checkpoint.empty()) {
    auto c = Checkpoint::Open(checkpoint);
    if (!c.ok()) Die(c.error().ToString());
    ck = std::move(*c);
    auto plan = PlanShards(*ck, ShardSpec{tp, rank});
    if (!plan.ok()) Die(plan.error().ToString());
    tensors = std::move(*plan);
    if (baseline) baseline_gbps = BaselineGbps(*ck, &baseline_bytes);
    auto a = Arena::Load(*ck, tensors, opts, &stats);
    if (!a.ok()) Die(a.error().ToString());
    arena = std::move(*a);
  } else {
    auto total = ParseBytes(total_str);
    if (!total.ok()) Die(total.error().ToString());
    uint64_t each = *total / static_cast<uint64_t>(synthetic) / 256 * 256;
    if (each == 0) Die("--total-bytes is too small for that many tensors");
    for (int i = 0; i < synthetic; ++i) {
      ShardedTensor t;
      t.name = "synthetic." + std::to_string(i) + ".weight";
      t.dtype = DType::kU8;
      t.shape = {static_cast<int64_t>(each)};
      t.nbytes = each;
      tensors.push_back(std::move(t));
    }
    auto a = Arena::Synthesize(tensors, opts, &stats);
    if (!a.ok()) Die(a.error().ToString());
    arena = std::move(*a);
  }
  const Manifest& m = arena->manifest();
  std::printf("wsup-bench-attach: %s on %s\n", checkpoint.empty() ? "synthetic arena" : checkpoint.c_str(),
              where.c_str());
  std::printf("tensors %zu, allocations %zu, tensor bytes %s, arena %s\n\n", m.entries.size(),
              m.allocations.size(), Bytes(static_cast<double>(m.total_bytes())).c_str(),
              Bytes(static_cast<double>(m.arena_bytes())).c_str());
  Row("step", "time", "detail");
  if (baseline) {
    Row("baseline read (dd O_DIRECT 64M)",
        Fmt("%.3f s", static_cast<double>(baseline_bytes) / baseline_gbps / 1e9),
        Fmt("%.2f GB/s", baseline_gbps));
    results["baseline_gbps"] = baseline_gbps;
  }
  if (!checkpoint.empty()) {
    Row("load (plan, read, copy, seal)", Fmt("%.3f s", stats.seconds),
        Fmt("%.2f GB/s", stats.read_gbps) + ", read " + Bytes(static_cast<double>(stats.bytes_read)) + " (" +
            Fmt("%.0f%% O_DIRECT", stats.bytes_read ? 100.0 * static_cast<double>(stats.direct_bytes) /
                                                          static_cast<double>(stats.bytes_read)
                                                    : 0) +
            "), alloc " + Fmt("%.3f s", stats.alloc_seconds) + ", staging peak " +
            Bytes(static_cast<double>(stats.peak_staging_bytes)));
    if (baseline && baseline_gbps > 0) {
      Row("  load / baseline", "", Fmt("%.1f%%", 100.0 * stats.read_gbps / baseline_gbps));
    }
  } else {
    Row("synthesize (alloc + fill)", Fmt("%.3f s", stats.seconds),
        "alloc " + Fmt("%.3f s", stats.alloc_seconds));
  }
  Row("  peak RSS of this process", "", Bytes(static_cast<double>(PeakRssBytes())));
  if (verify && ck) {
    auto t0 = Clock::now();
    Status st = VerifyAgainstCheckpoint(*arena, *ck, tensors);
    if (!st.ok()) Die("verify: " + st.ToString());
    Row("verify (every tensor vs ReadShard)",
        Fmt("%.3f s", std::chrono::duration<double>(Clock::now() - t0).count()), "identical");
  }
  results["load_seconds"] = stats.seconds;
  results["load_gbps"] = stats.read_gbps;
  results["bytes_read"] = stats.bytes_read;
  results["direct_bytes"] = stats.direct_bytes;
  results["peak_staging_bytes"] = stats.peak_staging_bytes;
  results["peak_rss_bytes"] = PeakRssBytes();
  results["tensors"] = m.entries.size();
  results["allocations"] = m.allocations.size();

  // (b) attach through fds, in a fresh process
  {
    // The holder has its reply ready before anyone asks (as the holder
    // server does), so the timing is the client's side of an attach.
    const std::string reply = ManifestToJson(m).dump();
    std::vector<int> fds;
    for (const auto& fd : arena->fds()) fds.push_back(fd.get());
    Spawned child = SpawnChild("fd", is_cuda ? device : -1);
    nlohmann::json r = Serve(child, reply, fds);
    double ms = r["attach_ms"].get<double>();
    Row("attach via fds (fresh process)", Fmt("%.3f ms", ms),
        std::to_string(r["allocations"].get<size_t>()) + " allocations, " +
            std::to_string(r["found"].get<size_t>()) + " tensors addressable; context init " +
            Fmt("%.1f ms", r["init_ms"].get<double>()));
    Row("  of which", "",
        "request+receive " + Fmt("%.3f ms", r["recv_ms"].get<double>()) + " (manifest " +
            Bytes(r["manifest_bytes"].get<double>()) + "), JSON parse " +
            Fmt("%.3f ms", r["json_parse_ms"].get<double>()) + ", manifest checks " +
            Fmt("%.3f ms", r["manifest_ms"].get<double>()) + ", map + name table " +
            Fmt("%.3f ms", r["map_ms"].get<double>()));
    results["fd_attach_ms"] = ms;
    results["fd_attach_breakdown"] = {{"recv_ms", r["recv_ms"]},
                                      {"json_parse_ms", r["json_parse_ms"]},
                                      {"manifest_ms", r["manifest_ms"]},
                                      {"map_ms", r["map_ms"]}};
    results["fd_init_ms"] = r["init_ms"];
  }

  // (c) legacy IPC: one cuMemAlloc and one handle per tensor
  if (is_cuda && !skip_ipc) {
    std::vector<uint64_t> sizes;
    for (const auto& e : m.entries) sizes.push_back(e.nbytes);
    std::vector<std::string> names;
    for (const auto& e : m.entries) names.push_back(e.name);
    arena.reset();  // room on the device for the per-tensor buffers
    auto ctx = cuda::PrimaryContext::Retain(device);
    if (!ctx.ok()) Die(ctx.error().ToString());
    if (Status st = ctx->MakeCurrent(); !st.ok()) Die(st.ToString());
    std::vector<cuda::DevicePtr> bufs;
    std::string payload;
    auto t0 = Clock::now();
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto p = cuda::MemAlloc(std::max<uint64_t>(sizes[i], 1));
      if (!p.ok()) Die(p.error().ToString());
      bufs.push_back(*p);
      if (Status st = cuda::MemsetD8(*p, Arena::SyntheticByte(i), sizes[i]); !st.ok()) Die(st.ToString());
      auto h = cuda::IpcGetMemHandle(*p);
      if (!h.ok()) Die(h.error().ToString());
      uint32_t len = static_cast<uint32_t>(names[i].size());
      payload.append(reinterpret_cast<const char*>(&len), 4);
      payload += names[i];
      payload.append(reinterpret_cast<const char*>(&sizes[i]), 8);
      payload.append(h->data(), h->size());
    }
    double export_ms = Ms(t0, Clock::now());
    Spawned child = SpawnChild("ipc", device);
    nlohmann::json r = Serve(child, payload, {});
    double ms = r["attach_ms"].get<double>();
    Row("attach via cuIpcOpenMemHandle", Fmt("%.3f ms", ms),
        std::to_string(r["tensors"].get<size_t>()) + " handles, " +
            Fmt("%.1f us per tensor", 1000.0 * ms / static_cast<double>(std::max<size_t>(1, sizes.size()))) +
            "; context init " + Fmt("%.1f ms", r["init_ms"].get<double>()) + "; holder side alloc+export " +
            Fmt("%.1f ms", export_ms));
    results["ipc_attach_ms"] = ms;
    results["ipc_init_ms"] = r["init_ms"];
    for (auto p : bufs) (void)cuda::MemFree(p);
  }
  if (json_out) std::printf("%s\n", results.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace wsup

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--child") {
    int device = std::atoi(argv[3]);
    if (std::string(argv[2]) == "fd") return wsup::ChildFd(device);
    if (std::string(argv[2]) == "ipc") return wsup::ChildIpc(device);
    return 2;
  }
  return wsup::Main(argc, argv);
}
