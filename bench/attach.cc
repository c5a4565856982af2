// wsup-bench-attach: what a cold load and an attach cost, in one run.
//
//   (a) the arena: Arena::Load of a checkpoint (GB/s, staging, peak RSS;
//       --baseline first reads the same files dd-like with O_DIRECT), or N
//       synthetic tensors made without disk (--synthetic). --pad-to SIZE then
//       adds padding tensors synthesized in the arena's own memory (filled
//       on the device for cuda; never read from disk) until the arena holds
//       SIZE. The loaded allocations and the padding's become ONE arena: one
//       manifest, one attach. The table says which bytes came from disk and
//       which were synthesized.
//   (b) attach through fds: the arena is served by a HolderServer (the
//       holder's own protocol code, on a loop thread) and fresh processes
//       attach as an engine does (client Attach()), timed from connect to
//       every tensor addressable, with the phases (connect, handshake, decode,
//       checks, index, map). --runs fresh processes each, asking for the
//       binary tensor table, and then for JSON entries (what clients older
//       than the table get).
//   (c) attach through legacy CUDA IPC (cuda only): the same tensors (names
//       and sizes, padding included) as one cuMemAlloc buffer each, opened in
//       a fresh process with one cuIpcOpenMemHandle per tensor. The arena is
//       released first: two copies of it would not fit on the GPU.
// Fresh processes are this program re-executed (--child), since a process
// that has initialised CUDA cannot use it in a forked child.
//
//   wsup-bench-attach --checkpoint DIR [--pad-to 96G] [--backend cuda] [--baseline]
//   wsup-bench-attach --synthetic 20000 --total-bytes 256M --backend host
//   wsup-bench-attach --socket SOCK --fingerprint FP.json --backend host --runs 15 --json
//       (b) only, against a running wsup-holder: fresh processes attach its
//       socket with the fingerprint in FP.json (bench/attach_python.py
//       compares this with attaching from Python)
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "client/client.h"
#include "client/mapping.h"
#include "common/fs.h"
#include "gpu/cuda_driver.h"
#include "holder/arena.h"
#include "holder/server.h"
#include "bench/attach_report.h"
#include "testkit/fd_channel.h"
#include "wire/manifest.h"

namespace wsup {
namespace {

using namespace attach_report;
constexpr int kChildSock = 3;
// Padding tensors are at most this large (one per GiB of padding).
constexpr uint64_t kPaddingTensorBytes = 1ull << 30;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "wsup-bench-attach: %s\n", what.c_str());
  std::exit(1);
}

// --- the fresh processes ---

// Attaches as an engine does and reports the outcome's phases.
int ChildFd(int device, const std::string& socket, const std::string& fp_path, bool table) {
  auto text = ReadFile(fp_path, 1 << 20);
  if (!text.ok()) Die(text.error().ToString());
  auto fp = Fingerprint::FromJson(nlohmann::json::parse(*text));
  if (!fp.ok()) Die(fp.error().ToString());
  nlohmann::json out;
  auto t_init = Clock::now();
  cuda::PrimaryContext ctx;
  if (device >= 0) {
    auto c = cuda::PrimaryContext::Retain(device);
    if (!c.ok()) Die(c.error().ToString());
    ctx = std::move(*c);
    if (Status st = ctx.MakeCurrent(); !st.ok()) Die(st.ToString());
  }
  out["init_ms"] = Ms(t_init, Clock::now());
  AttachOptions o;
  o.socket_path = socket;
  o.client_name = "bench";
  o.device = device < 0 ? 0 : device;
  o.tensor_table = table;
  auto r = Attach(o, *fp);
  if (!r.ok()) Die(r.error().ToString());
  if (!r->attachment) Die("attached nothing: " + r->outcome.reason);
  const AttachOutcome& oc = r->outcome;
  out["attach_ms"] = oc.ms;
  out["phases"] = {{"connect_ms", oc.phases.connect_ms}, {"handshake_ms", oc.phases.handshake_ms},
                   {"decode_ms", oc.phases.decode_ms},   {"checks_ms", oc.phases.checks_ms},
                   {"index_ms", oc.phases.index_ms},     {"map_ms", oc.phases.map_ms},
                   {"overlapped", oc.phases.overlapped}};
  // Outside the timing: every tensor is found, at its own address.
  const Attachment& a = *r->attachment;
  size_t found = 0;
  for (const auto& e : a.manifest().entries) {
    TensorView v = a.Find(e.name);
    found += v.entry == &e && v.data != nullptr;
  }
  out["tensors"] = a.size();
  out["found"] = found;
  out["allocations"] = a.manifest().allocations.size();
  (void)test::SendMessage(kChildSock, out.dump());
  return found == a.size() ? 0 : 1;
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

Spawned SpawnChild(const std::vector<std::string>& args) {
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) Die("readlink /proc/self/exe failed");
  exe[n] = '\0';
  auto pair = test::SocketPair();
  if (!pair.ok()) Die(pair.error().ToString());
  std::vector<std::string> argv_s = {exe, "--child"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) Die("fork failed");
  if (pid == 0) {
    int fd = pair->second.get();
    if (fd == kChildSock) {
      ::fcntl(fd, F_SETFD, 0);
    } else {
      ::dup2(fd, kChildSock);
    }
    ::execv(exe, argv.data());
    ::_exit(127);
  }
  Spawned s;
  s.pid = pid;
  s.sock = std::move(pair->first);
  return s;
}

// Waits for the child's report and its exit.
nlohmann::json Finish(Spawned& child) {
  std::string report;
  Status st = test::RecvMessage(child.sock.get(), &report, nullptr, std::chrono::minutes(10));
  int status = 0;
  ::waitpid(child.pid, &status, 0);
  if (!st.ok()) Die("child: " + st.ToString());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("child failed: " + report);
  return nlohmann::json::parse(report);
}

// The IPC child asks, gets the handles, reports.
nlohmann::json ServeIpc(Spawned& child, const std::string& payload) {
  std::string req;
  if (Status st = test::RecvMessage(child.sock.get(), &req, nullptr, std::chrono::minutes(5)); !st.ok()) {
    Die("child: " + st.ToString());
  }
  if (Status st = test::SendMessage(child.sock.get(), payload, {}); !st.ok()) Die(st.ToString());
  return Finish(child);
}

// A HolderServer on its own loop thread, until Stop().
class ServerThread {
 public:
  ServerThread(const Arena& arena, Fingerprint fp, ServerOptions so)
      : server_(&loop_, arena, std::move(fp), so) {
    uv_loop_init(&loop_);
  }
  ~ServerThread() { Stop(); }
  Status Start() {
    WSUP_RETURN_IF_ERROR(server_.Start());
    uv_async_init(&loop_, &stop_, &ServerThread::OnStop);
    stop_.data = this;
    thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
    return {};
  }
  void Stop() {
    if (!thread_.joinable()) return;
    uv_async_send(&stop_);
    thread_.join();
    uv_loop_close(&loop_);
  }

 private:
  static void OnStop(uv_async_t* a) {
    auto* self = static_cast<ServerThread*>(a->data);
    self->server_.Close([a] { uv_close(reinterpret_cast<uv_handle_t*>(a), nullptr); });
  }
  uv_loop_t loop_{};
  HolderServer server_;
  uv_async_t stop_{};
  std::thread thread_;
};

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

// Maps the arena in this process and compares every checkpoint tensor's
// bytes with what ReadShard reads from the checkpoint.
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

// One arena of the loaded allocations followed by the padding's: the
// manifests are joined (the padding's allocation indices shifted) and the fds
// adopted together, as a holder adopts kept fds.
Result<Arena> JoinArenas(const Arena& loaded, const Arena& padding) {
  Manifest m = loaded.manifest();
  const auto shift = static_cast<uint32_t>(m.allocations.size());
  for (const auto& a : padding.manifest().allocations) m.allocations.push_back(a);
  for (auto e : padding.manifest().entries) {
    e.alloc += shift;
    m.entries.push_back(std::move(e));
  }
  WSUP_ASSIGN_OR_RETURN(std::vector<UniqueFd> fds, loaded.DupFds());
  WSUP_ASSIGN_OR_RETURN(std::vector<UniqueFd> more, padding.DupFds());
  for (auto& fd : more) fds.push_back(std::move(fd));
  return Arena::Adopt(std::move(m), std::move(fds));
}

// (b) against a running holder: `runs` fresh processes attach `socket`
// with the tensor table, each timed from connect to every tensor
// addressable.
int AttachHolder(const std::string& socket, const std::string& fp_path, int device, int runs, bool json_out) {
  std::vector<nlohmann::json> reports;
  nlohmann::json each = nlohmann::json::array();
  for (int r = 0; r < runs; ++r) {
    Spawned child = SpawnChild({"fd", std::to_string(device), socket, fp_path, "1"});
    reports.push_back(Finish(child));
    each.push_back(reports.back()["attach_ms"]);
  }
  nlohmann::json p = MedianPhases(reports);
  Row("attach via fds, tensor table", Fmt("%.3f ms", p["attach_ms"].get<double>()),
      "median of " + std::to_string(runs) + " fresh processes (" + Fmt("%.3f", p["attach_min_ms"].get<double>()) +
          " to " + Fmt("%.3f", p["attach_max_ms"].get<double>()) + "), " +
          std::to_string(reports.front()["found"].get<size_t>()) + " tensors addressable");
  Row("  of which (medians)", "", PhasesText(p));
  if (json_out) {
    nlohmann::json out = {{"fd_attach", p}, {"attach_ms_runs", each}, {"tensors", reports.front()["tensors"]}};
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{"wsup-bench-attach: cold load and attach cost of an arena"};
  std::string checkpoint, backend = "cuda", total_str = "1G", pad_str, socket, fp_file;
  int tp = 1, rank = 0, device = 0, synthetic = 0, runs = 3;
  LoadOptions opts;
  uint64_t staging_mb = opts.staging_bytes >> 20;
  bool baseline = false, no_direct = false, skip_ipc = false, json_out = false, verify = false;
  app.add_option("--checkpoint", checkpoint, "checkpoint folder to load");
  app.add_option("--synthetic", synthetic, "instead: synthesize this many tensors without disk");
  app.add_option("--total-bytes", total_str, "synthetic arena size, e.g. 96G");
  app.add_option("--pad-to", pad_str,
                 "add padding tensors synthesized in the arena's memory (not read from disk) up to this "
                 "size, e.g. 96G");
  app.add_option("--socket", socket, "instead: attach this running holder's socket (fresh processes only)");
  app.add_option("--fingerprint", fp_file, "with --socket: a JSON file of the fingerprint to present");
  app.add_option("--tp", tp, "tensor-parallel size");
  app.add_option("--rank", rank, "tensor-parallel rank");
  app.add_option("--backend", backend, "host or cuda")->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--device", device, "cuda ordinal");
  app.add_option("--runs", runs, "fresh attaching processes per way (medians are shown)")
      ->check(CLI::Range(1, 100));
  app.add_option("--read-threads", opts.read_threads, "parallel file readers");
  app.add_option("--staging-mb", staging_mb, "size of each staging buffer in MiB");
  app.add_option("--staging-buffers", opts.staging_buffers, "staging buffers in flight");
  app.add_flag("--baseline", baseline, "first read the files dd-like (O_DIRECT, 64 MiB, one thread)");
  app.add_flag("--no-direct", no_direct, "load with buffered reads only");
  app.add_flag("--skip-ipc", skip_ipc, "skip the legacy cuIpcOpenMemHandle comparison");
  app.add_flag("--json", json_out, "also print the results as one JSON line");
  app.add_flag("--verify", verify, "after loading, compare every tensor with ReadShard (checkpoint mode)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);  // not a line per attach from the server
  if (!socket.empty()) {
    if (fp_file.empty()) Die("--socket needs --fingerprint FILE (the holder's fingerprint as JSON)");
    return AttachHolder(socket, fp_file, backend == "cuda" ? device : -1, runs, json_out);
  }
  if (checkpoint.empty() == (synthetic == 0)) Die("give --checkpoint DIR or --synthetic N (one of them)");
  opts.backend = backend;
  opts.device = device;
  opts.staging_bytes = staging_mb << 20;
  opts.direct_io = !no_direct;
  const bool is_cuda = backend == "cuda";
  nlohmann::json results;

  std::string where = "host (memfd)";
  if (is_cuda) {
    auto info = cuda::GetDeviceInfo(device);
    if (!info.ok()) Die(info.error().ToString());
    auto ver = cuda::DriverVersion();
    where = "cuda device " + std::to_string(device) + " (" + info->name + ", " + info->uuid +
            ", driver CUDA " + (ver.ok() ? cuda::VersionString(*ver) : "?") + ")";
  }
  results["where"] = where;
  results["runs"] = runs;

  // (a) the arena
  std::vector<ShardedTensor> tensors;
  std::optional<Checkpoint> ck;
  LoadStats stats;
  std::optional<Arena> arena;
  double baseline_gbps = 0;
  uint64_t baseline_bytes = 0;
  nlohmann::json fp_json;
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
    auto in = LocalFingerprintInputs(checkpoint, "", ShardSpec{tp, rank}, backend, device);
    if (!in.ok()) Die(in.error().ToString());
    fp_json = Fingerprint::Compute(*ck, *in).ToJson();
    results["disk"] = {
        {"files", ck->files().size()}, {"tensors", tensors.size()}, {"bytes_read", stats.bytes_read}};
  } else {
    auto total = ParseBytes(total_str);
    if (!total.ok()) Die(total.error().ToString());
    // Named and shaped like the generated checkpoint's tensors (bf16
    // matrices of 256 columns in a mixture-of-experts layout), so that the
    // tensor table is as large as a real one.
    uint64_t each = *total / static_cast<uint64_t>(synthetic) / 512 * 512;
    if (each == 0) Die("--total-bytes is too small for that many tensors");
    static const char* kProj[] = {"gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < synthetic; ++i) {
      ShardedTensor t;
      t.name = "model.layers." + std::to_string(i / 192) + ".mlp.experts." + std::to_string((i / 3) % 64) +
               "." + kProj[i % 3] + ".weight";
      t.dtype = DType::kBF16;
      t.shape = {static_cast<int64_t>(each / 512), 256};
      t.nbytes = each;
      tensors.push_back(std::move(t));
    }
    auto a = Arena::Synthesize(tensors, opts, &stats);
    if (!a.ok()) Die(a.error().ToString());
    arena = std::move(*a);
    fp_json = {{"model_path", "/synthetic"}, {"tp_size", "1"}, {"tp_rank", "0"}, {"backend", backend}};
    results["disk"] = {{"files", 0}, {"tensors", 0}, {"bytes_read", 0}};
  }
  const size_t own_tensors = arena->manifest().entries.size();
  const uint64_t own_arena_bytes = arena->manifest().arena_bytes();

  // Padding, synthesized in the arena's memory, joined into the same arena.
  uint64_t pad_bytes = 0;
  size_t pad_tensors = 0;
  double pad_seconds = 0;
  if (!pad_str.empty()) {
    auto target = ParseBytes(pad_str);
    if (!target.ok()) Die(target.error().ToString());
    if (*target > own_arena_bytes) {
      std::vector<ShardedTensor> pad;
      for (uint64_t left = *target - own_arena_bytes; left > 0;) {
        uint64_t each = std::min(left, kPaddingTensorBytes);
        each = (each + 255) / 256 * 256;
        ShardedTensor t;
        t.name = "padding.synthetic." + std::to_string(pad.size());
        t.dtype = DType::kU8;
        t.shape = {static_cast<int64_t>(each)};
        t.nbytes = each;
        pad.push_back(std::move(t));
        left -= std::min(left, each);
      }
      LoadStats pad_stats;
      auto p = Arena::Synthesize(pad, opts, &pad_stats);
      if (!p.ok()) Die("padding: " + p.error().ToString());
      pad_seconds = pad_stats.seconds;
      pad_tensors = pad.size();
      pad_bytes = p->manifest().total_bytes();
      auto joined = JoinArenas(*arena, *p);
      if (!joined.ok()) Die("joining the padding to the arena: " + joined.error().ToString());
      arena = std::move(*joined);  // the padding's own Arena closes its fds; the joined one keeps dups
    }
  }
  results["padding"] = {{"tensors", pad_tensors}, {"bytes", pad_bytes}, {"seconds", pad_seconds}};

  const Manifest& m = arena->manifest();
  std::printf("wsup-bench-attach: %s on %s\n", checkpoint.empty() ? "synthetic arena" : checkpoint.c_str(),
              where.c_str());
  std::printf("arena: %zu tensors, %zu allocations, tensor bytes %s, arena %s\n", m.entries.size(),
              m.allocations.size(), Bytes(static_cast<double>(m.total_bytes())).c_str(),
              Bytes(static_cast<double>(m.arena_bytes())).c_str());
  if (ck) {
    std::printf("  read from disk: %zu files, %zu tensors, %s\n", ck->files().size(), own_tensors,
                Bytes(static_cast<double>(stats.bytes_read)).c_str());
  } else {
    std::printf("  synthesized (no checkpoint): %zu tensors\n", own_tensors);
  }
  if (pad_tensors > 0) {
    std::printf("  padding synthesized in the arena's memory, NOT read from disk: %zu tensors, %s\n",
                pad_tensors, Bytes(static_cast<double>(pad_bytes)).c_str());
  }
  std::printf("\n");
  Row("step", "time", "detail");
  if (baseline) {
    Row("baseline read (dd O_DIRECT 64M)",
        Fmt("%.3f s", static_cast<double>(baseline_bytes) / baseline_gbps / 1e9),
        Fmt("%.2f GB/s", baseline_gbps));
    results["baseline_gbps"] = baseline_gbps;
  }
  if (ck) {
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
  if (pad_tensors > 0) {
    Row("padding (alloc + fill, no disk)", Fmt("%.3f s", pad_seconds),
        std::to_string(pad_tensors) + " tensors, " + Bytes(static_cast<double>(pad_bytes)));
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
  results["arena_bytes"] = m.arena_bytes();
  results["tensor_bytes"] = m.total_bytes();

  // (b) attach through fds, fresh processes against a real holder server
  {
    auto fp = Fingerprint::FromJson(fp_json);
    if (!fp.ok()) Die(fp.error().ToString());
    char tmpl[] = "/tmp/wsup-bench-attach-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
    const std::string dir = tmpl;
    const std::string fp_path = dir + "/fingerprint.json";
    if (Status st = WriteFileAtomic(fp_path, fp_json.dump(), 0600); !st.ok()) Die(st.ToString());
    ServerOptions so;
    so.socket_path = dir + "/holder.sock";
    so.deployment = "bench";
    ServerThread server(*arena, *fp, so);
    if (Status st = server.Start(); !st.ok()) Die(st.ToString());
    const std::string dev = std::to_string(is_cuda ? device : -1);
    for (bool table : {true, false}) {
      std::vector<nlohmann::json> reports;
      for (int r = 0; r < runs; ++r) {
        Spawned child = SpawnChild({"fd", dev, so.socket_path, fp_path, table ? "1" : "0"});
        reports.push_back(Finish(child));
      }
      const nlohmann::json& first = reports.front();
      nlohmann::json p = MedianPhases(reports);
      const char* label = table ? "attach via fds, tensor table" : "attach via fds, JSON entries";
      Row(label, Fmt("%.3f ms", p["attach_ms"].get<double>()),
          "median of " + std::to_string(runs) + " fresh processes (" +
              Fmt("%.3f", p["attach_min_ms"].get<double>()) + " to " +
              Fmt("%.3f", p["attach_max_ms"].get<double>()) + "), " +
              std::to_string(first["allocations"].get<size_t>()) + " allocations, " +
              std::to_string(first["found"].get<size_t>()) + " tensors addressable; context init " +
              Fmt("%.1f ms", p["init_ms"].get<double>()));
      Row("  of which (medians)", "", PhasesText(p));
      results[table ? "fd_attach" : "fd_attach_json"] = p;
    }
    results["fd_attach_ms"] = results["fd_attach"]["attach_ms"];
    server.Stop();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  // (c) legacy IPC: one cuMemAlloc and one handle per tensor
  if (is_cuda && !skip_ipc) {
    std::vector<uint64_t> sizes;
    std::vector<std::string> names;
    for (const auto& e : m.entries) {
      sizes.push_back(e.nbytes);
      names.push_back(e.name);
    }
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
    Spawned child = SpawnChild({"ipc", std::to_string(device)});
    nlohmann::json r = ServeIpc(child, payload);
    double ms = r["attach_ms"].get<double>();
    Row("attach via cuIpcOpenMemHandle", Fmt("%.3f ms", ms),
        std::to_string(r["tensors"].get<size_t>()) + " handles, " +
            Fmt("%.1f us per tensor", 1000.0 * ms / static_cast<double>(std::max<size_t>(1, sizes.size()))) +
            "; context init " + Fmt("%.1f ms", r["init_ms"].get<double>()) + "; holder side alloc+export " +
            Fmt("%.1f ms", export_ms));
    double fd_ms = results["fd_attach_ms"].get<double>();
    if (fd_ms > 0) Row("  IPC / fds", "", Fmt("%.0fx", ms / fd_ms));
    results["ipc_attach_ms"] = ms;
    results["ipc_tensors"] = r["tensors"];
    results["ipc_init_ms"] = r["init_ms"];
    for (auto p : bufs) (void)cuda::MemFree(p);
  }
  if (json_out) std::printf("%s\n", results.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace wsup

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--child") {
    std::string mode = argv[2];
    if (mode == "fd" && argc == 7) {
      return wsup::ChildFd(std::atoi(argv[3]), argv[4], argv[5], std::string(argv[6]) == "1");
    }
    if (mode == "ipc" && argc == 4) return wsup::ChildIpc(std::atoi(argv[3]));
    return 2;
  }
  return wsup::Main(argc, argv);
}
