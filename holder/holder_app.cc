#include "holder/holder_app.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/quant.h"
#include "checkpoint/sharding.h"
#include "common/signals.h"
#include "gpu/local_fingerprint.h"
#include "holder/arena.h"
#include "holder/kv_pool.h"
#include "holder/layout_store.h"
#include "holder/server.h"
#include "wire/kv_pool_record.h"
#include "wire/layout_record.h"
#include "wire/protocol.h"

namespace wsup {

namespace {

int ExitCodeFor(const Error& e) {
  switch (e.code()) {
    case Code::kInvalidArgument:
    case Code::kNotFound:
    case Code::kCorrupt:
    case Code::kRefused:
    case Code::kMismatch:
      return kHolderExitRefused;
    default:
      return kHolderExitFailure;
  }
}

bool FdIsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

// Many clients at once (and many arena fds) need more than the common
// soft limit of 1024 open files; the hard limit is ours to take.
void RaiseOpenFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      spdlog::warn("cannot raise the open-file limit: {}", std::strerror(errno));
    }
  }
}

struct Loaded {
  Arena arena;
  Fingerprint fingerprint;
};

Result<Loaded> LoadFromDisk(const HolderConfig& cfg) {
  std::string backend = cfg.backend.empty() ? "host" : cfg.backend;
  ShardSpec spec{cfg.tp_size.value_or(1), cfg.tp_rank.value_or(0), cfg.ep_size.value_or(1),
                 cfg.ep_rank.value_or(0)};
  WSUP_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(cfg.model_dir));
  WSUP_RETURN_IF_ERROR(CheckZeroCopyAllowed(ckpt));
  auto shards = PlanShards(ckpt, spec);
  if (!shards.ok()) {
    std::string ep = spec.ep_size > 1
                         ? ", ep rank " + std::to_string(spec.ep_rank) + " of " + std::to_string(spec.ep_size)
                         : "";
    return shards.error().With(cfg.model_dir + " (tp rank " + std::to_string(spec.tp_rank) + " of " +
                               std::to_string(spec.tp_size) + ep + ")");
  }
  WSUP_ASSIGN_OR_RETURN(FingerprintInputs in,
                        LocalFingerprintInputs(cfg.model_dir, cfg.revision, spec, backend, cfg.device));
  Loaded out;
  out.fingerprint = Fingerprint::Compute(ckpt, in);
  LoadOptions lo;
  lo.backend = backend;
  lo.device = cfg.device;
  lo.read_threads = cfg.read_threads;
  LoadStats stats;
  WSUP_ASSIGN_OR_RETURN(out.arena, Arena::Load(ckpt, *shards, lo, &stats));
  spdlog::info(
      "loaded {} tensors ({} bytes, tp rank {} of {}, ep rank {} of {}) from {} into {} allocations "
      "({} backend) in {:.3f} s ({:.2f} GB/s)",
      out.arena.manifest().entries.size(), out.arena.manifest().total_bytes(), spec.tp_rank, spec.tp_size,
      spec.ep_rank, spec.ep_size, cfg.model_dir, out.arena.manifest().allocations.size(), backend,
      stats.seconds, stats.read_gbps);
  return out;
}

Result<Loaded> Adopt(const HolderConfig& cfg) {
  WSUP_ASSIGN_OR_RETURN(ArenaRecord record, ReadArenaRecord(cfg.adopt_manifest));
  WSUP_ASSIGN_OR_RETURN(std::vector<int> fd_numbers, ParseFdList(cfg.adopt_fds));
  const Manifest& m = record.manifest;
  if (fd_numbers.size() != m.allocations.size()) {
    return InvalidArgument("--adopt-fds names " + std::to_string(fd_numbers.size()) + " fds but " +
                           cfg.adopt_manifest + " describes " + std::to_string(m.allocations.size()) +
                           " allocations; pass one inherited fd per allocation, in allocation order");
  }
  if (record.fingerprint.Get("backend") != m.backend) {
    return Corrupt(cfg.adopt_manifest + ": the fingerprint says backend '" + record.fingerprint.Get("backend") +
                   "' but the manifest '" + m.backend + "'; the record is damaged: write it again from a keeper");
  }
  if (!cfg.backend.empty() && cfg.backend != m.backend) {
    return InvalidArgument("--backend " + cfg.backend + " differs from the adopted arena's backend " + m.backend +
                           " (" + cfg.adopt_manifest + "); drop --backend or adopt a matching arena");
  }
  struct Given {
    const char* flag;
    const char* field;
    std::optional<int> value;
  };
  for (const Given& g :
       {Given{"--tp-size", "tp_size", cfg.tp_size}, Given{"--tp-rank", "tp_rank", cfg.tp_rank},
        Given{"--ep-size", "ep_size", cfg.ep_size}, Given{"--ep-rank", "ep_rank", cfg.ep_rank}}) {
    std::string held = record.fingerprint.Get(g.field);
    if (g.value && std::to_string(*g.value) != held) {
      return InvalidArgument(std::string(g.flag) + " " + std::to_string(*g.value) +
                             " differs from the adopted arena's " + g.field + " " + held + " (" +
                             cfg.adopt_manifest + "); drop the flag or adopt a matching arena");
    }
  }
  std::vector<UniqueFd> fds;
  for (int n : fd_numbers) {
    if (!FdIsOpen(n)) {
      return InvalidArgument("--adopt-fds: fd " + std::to_string(n) +
                             " is not open in this process; the parent must pass the kept arena fds as "
                             "these numbers");
    }
    ::fcntl(n, F_SETFD, FD_CLOEXEC);  // never leak the arena into a child
    fds.emplace_back(n);
  }
  Loaded out;
  out.fingerprint = std::move(record.fingerprint);
  auto arena = Arena::Adopt(std::move(record.manifest), std::move(fds));
  if (!arena.ok()) return arena.error().With("adopting " + cfg.adopt_manifest);
  out.arena = std::move(arena).value();
  spdlog::info("adopted an arena of {} tensors ({} bytes, {} allocations, {} backend) from {} inherited fds and "
               "{}; the checkpoint was not read{}",
               out.arena.manifest().entries.size(), out.arena.manifest().total_bytes(),
               out.arena.manifest().allocations.size(), out.arena.manifest().backend, fd_numbers.size(),
               cfg.adopt_manifest,
               cfg.model_dir.empty() ? "" : " (--model " + cfg.model_dir + " is ignored when adopting)");
  return out;
}

// ---------------------------------------------------------------- the KV pool

// The memory a pool of this holder lives in: its weights' backend and GPU.
Result<std::unique_ptr<LayoutMemory>> PoolMemory(const std::string& backend, int device) {
  if (backend != "cuda") return MakeHostLayoutMemory();
  return MakeCudaLayoutMemory(device);
}

// --adopt-kv-pool: the kept pool from its record and the inherited fds it
// names. `taken`: fds that are someone else's (the ready fd, the arena's,
// the layouts'), never adopted or closed here. On a refusal the fds the
// record names that are ours are closed, so the old memory is not held.
Result<KvPool> AdoptKeptPool(const HolderConfig& cfg, const LayoutMemory& memory,
                             const std::set<int>& taken) {
  auto ours = [&](int fd) { return taken.count(fd) == 0 && FdIsOpen(fd); };
  auto close_named = [&] {
    for (int fd : ReadKvPoolRecordNamedFds(cfg.adopt_kv_pool)) {
      if (ours(fd)) ::close(fd);
    }
  };
  auto record = ReadKvPoolRecord(cfg.adopt_kv_pool);
  if (!record.ok()) {
    close_named();
    return record.error();
  }
  std::vector<UniqueFd> fds;
  for (int n : record->fds) {
    if (!ours(n)) {
      close_named();
      return InvalidArgument(cfg.adopt_kv_pool + ": fd " + std::to_string(n) +
                             (taken.count(n) != 0
                                  ? " is another kept thing's (the ready fd, an arena or layout fd)"
                                  : " is not open in this process") +
                             "; the parent must pass the kept pool's fds as the numbers its record names");
    }
  }
  for (int n : record->fds) {
    ::fcntl(n, F_SETFD, FD_CLOEXEC);  // never leak the pool into a child
    fds.emplace_back(n);
  }
  auto pool = AdoptKvPool(memory, std::move(record->pool), std::move(fds));  // closes them on a refusal
  if (!pool.ok()) return pool.error().With(cfg.adopt_kv_pool + ": the record disagrees with its fds");
  return pool;
}

std::string DescribePool(const KvPool& p) {
  std::string where = p.msg.backend == "cuda"
                          ? "cuda device " + std::to_string(p.msg.device) + " (" + p.msg.device_uuid + ")"
                          : std::string("host memory");
  return "KV pool " + p.msg.id + ": " + std::to_string(p.msg.bytes()) + " bytes (" +
         std::to_string(p.msg.bytes() / kMiB) + " MiB) in " + std::to_string(p.fds.size()) +
         " allocations in " + where;
}

// The inherited fds that are not the KV pool's: the ready fd and the
// arena's (the layouts' are added as their record is read).
std::set<int> TakenFds(const HolderConfig& cfg) {
  std::set<int> taken;
  if (cfg.ready_fd >= 0) taken.insert(cfg.ready_fd);
  if (!cfg.adopt_fds.empty()) {
    auto list = ParseFdList(cfg.adopt_fds);
    if (list.ok()) taken.insert(list->begin(), list->end());
  }
  return taken;
}

// For the ready line.
std::string PoolWords(const std::optional<KvPool>& pool) {
  if (!pool) return "";
  return ", with KV pool " + pool->msg.id + " (" + std::to_string(pool->msg.bytes() / kMiB) + " MiB" +
         (pool->adopted ? ", adopted" : "") + ")";
}

// The pool this holder serves: the kept one (--adopt-kv-pool), else a new
// one (--kv-pool-mib), else none. Fails only when a new pool cannot be made.
Result<std::optional<KvPool>> PreparePool(const HolderConfig& cfg, const std::string& backend, int device,
                                          const std::set<int>& taken) {
  if (cfg.kv_pool_mib == 0 && cfg.adopt_kv_pool.empty()) return std::optional<KvPool>();
  auto memory = PoolMemory(backend, device);
  if (!memory.ok()) {
    return memory.error().With("--kv-pool-mib " + std::to_string(cfg.kv_pool_mib) + " on " + backend +
                               " device " + std::to_string(device));
  }
  const uint64_t asked = static_cast<uint64_t>(cfg.kv_pool_mib) * kMiB;
  if (!cfg.adopt_kv_pool.empty()) {
    auto kept = AdoptKeptPool(cfg, **memory, taken);
    if (kept.ok()) {
      spdlog::info("{}: adopted from kept fds ({}); what the KV held is kept", DescribePool(*kept),
                   cfg.adopt_kv_pool);
      if (asked > 0 && kept->msg.bytes() != KvPoolSize(**memory, asked)) {
        spdlog::warn(
            "the kept KV pool has {} bytes, --kv-pool-mib {} asks for {}: the kept pool is served as it "
            "is (its memory exists); a pool of the new size is made when the node starts afresh "
            "(wsup stop, then wsup start)",
            kept->msg.bytes(), cfg.kv_pool_mib, KvPoolSize(**memory, asked));
      }
      return std::optional<KvPool>(std::move(kept).value());
    }
    // The error names the record once.
    spdlog::error(
        "--adopt-kv-pool: {}; the kept KV pool is not adopted and its fds are closed{}; if this repeats, "
        "run the same wsup version for the supervisor and its holders",
        kept.error().message(),
        asked > 0 ? ": a new pool is made (--kv-pool-mib), so what the KV held is lost"
                  : ", and without --kv-pool-mib this holder serves no pool");
  }
  if (asked == 0) return std::optional<KvPool>();
  auto made = MakeKvPool(**memory, asked);
  if (!made.ok()) {
    return Error(
        made.error().code(),
        "--kv-pool-mib " + std::to_string(cfg.kv_pool_mib) + ": cannot make a KV pool of " +
            std::to_string(cfg.kv_pool_mib) + " MiB in " +
            (backend == "cuda" ? "cuda device " + std::to_string(device) : std::string("host memory")) +
            ": " + made.error().message() +
            "; give a smaller --kv-pool-mib ([kv] pool_mib), or free that memory");
  }
  spdlog::info("{}: made", DescribePool(*made));
  return std::optional<KvPool>(std::move(made).value());
}

void AnnounceReady(int fd, const std::string& socket_path);

ServerOptions ServerOptionsFor(const HolderConfig& cfg, bool adopted) {
  ServerOptions so;
  so.socket_path = cfg.socket_path;
  so.handshake_timeout_ms = cfg.handshake_timeout_ms;
  so.idle_timeout_ms = cfg.idle_timeout_ms;
  so.max_connections = static_cast<size_t>(cfg.max_connections);
  so.deployment = cfg.deployment;
  so.revision = cfg.revision;
  so.adopted = adopted;
  return so;
}

// Runs the loop with the server until SIGTERM/SIGINT; returns the exit code.
int Serve(uv_loop_t* loop, HolderServer& server, const HolderConfig& cfg, const std::string& what) {
  Status started = server.Start();
  if (!started.ok()) {
    spdlog::error("{}", started.error().ToString());
    server.Close();
    uv_run(loop, UV_RUN_DEFAULT);
    return kHolderExitFailure;  // a busy socket or a fixed directory may do on the next try
  }
  // The first SIGTERM or SIGINT closes the socket and every connection;
  // the watchers stop at once, so a second signal ends the holder as it is.
  Signals signals(loop);
  bool stopping = false;
  auto on_signal = [&](int signum) {
    if (stopping) return;
    stopping = true;
    spdlog::info("received {}; closing the socket and every connection", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    signals.Stop();
    server.Close([&] { signals.Close(); });
  };
  signals.On(SIGTERM, on_signal);
  signals.On(SIGINT, on_signal);
  if (cfg.ready_fd >= 0) AnnounceReady(cfg.ready_fd, cfg.socket_path);
  spdlog::info("ready on {}{}{}", cfg.socket_path, cfg.deployment.empty() ? "" : " (deployment " + cfg.deployment + ")",
               what);
  uv_run(loop, UV_RUN_DEFAULT);
  return kHolderExitOk;
}

int CloseLoop(uv_loop_t* loop, int exit_code) {
  int rc = uv_loop_close(loop);
  if (rc != 0) spdlog::error("event loop closed with handles still open ({}); this is a bug", uv_strerror(rc));
  if (exit_code == kHolderExitOk) spdlog::info("stopped");
  return exit_code;
}

// --adopt-layouts: the kept layouts into the store. A layout that is refused
// (its record damaged, or disagreeing with its fds) is logged with its id
// and the fix, and its fds are closed; the others are adopted. Fails only
// for a file that is no layouts record at all.
// `named` gets every fd number the record names (none are the KV pool's).
Result<size_t> AdoptLayouts(const HolderConfig& cfg, LayoutStore* store, uint64_t now_ms,
                            std::set<int>* named) {
  WSUP_ASSIGN_OR_RETURN(LayoutsRecord record, ReadLayoutsRecord(cfg.adopt_layouts));
  for (const RefusedLayout& r : record.refused) named->insert(r.fds.begin(), r.fds.end());
  for (const LayoutRecord& r : record.layouts) named->insert(r.fds.begin(), r.fds.end());
  auto ours = [&](int fd) { return fd != cfg.ready_fd && FdIsOpen(fd); };
  const std::string not_adopted = "; it is not adopted (the next engine publishes it again)";
  for (const RefusedLayout& r : record.refused) {
    spdlog::error("{}: {}{}", cfg.adopt_layouts, r.error.message(), not_adopted);
    for (int fd : r.fds) {
      if (ours(fd)) ::close(fd);
    }
  }
  size_t adopted = 0;
  const size_t total = record.layouts.size() + record.refused.size();
  for (LayoutRecord& rec : record.layouts) {
    const std::string named = DescribeLayout(rec.id, rec.layout_hash);
    std::vector<UniqueFd> fds;
    std::string missing;
    for (int n : rec.fds) {
      if (!ours(n)) {
        missing = "fd " + std::to_string(n) + " is not open in this process" +
                  (n == cfg.ready_fd ? " (it is the --ready-fd)" : "");
        continue;
      }
      ::fcntl(n, F_SETFD, FD_CLOEXEC);  // never leak a layout into a child
      fds.emplace_back(n);
    }
    if (!missing.empty()) {
      spdlog::error("{}: {}: {}; the parent must pass each kept layout's fds as the numbers its record "
                    "names{}",
                    cfg.adopt_layouts, named, missing, not_adopted);
      continue;  // its open fds close with `fds`
    }
    auto l = store->Adopt(std::move(rec), std::move(fds), now_ms);
    if (!l.ok()) {
      spdlog::error("{}: {}", cfg.adopt_layouts, l.error().message());
      continue;
    }
    ++adopted;
  }
  spdlog::info("adopted {} of {} kept layouts from {}{}; no engine loads or publishes them again", adopted, total,
               cfg.adopt_layouts, adopted == total ? "" : " (the others were refused: see above)");
  return adopted;
}

// --layout engine: nothing is loaded; engines publish into the store.
int ServeLayouts(const HolderConfig& cfg) {
  std::unique_ptr<LayoutMemory> memory;
  if (cfg.backend == "cuda") {
    auto cuda = MakeCudaLayoutMemory(cfg.device);
    if (!cuda.ok()) {
      spdlog::error("--layout engine --backend cuda --device {}: {}", cfg.device, cuda.error().ToString());
      return ExitCodeFor(cuda.error());
    }
    memory = std::move(cuda).value();
    spdlog::info("engine-made layouts live on cuda device {} ({}): grants of VMM memory in multiples of {} bytes",
                 memory->device(), memory->device_uuid(), memory->granularity());
  } else {
    memory = MakeHostLayoutMemory();
  }
  LayoutStore store(std::move(memory), static_cast<uint64_t>(cfg.layout_max_bytes));
  uv_loop_t loop;
  uv_loop_init(&loop);
  size_t adopted = 0;
  std::set<int> taken = TakenFds(cfg);
  if (!cfg.adopt_layouts.empty()) {
    auto n = AdoptLayouts(cfg, &store, uv_now(&loop), &taken);
    if (!n.ok()) {
      spdlog::error("{}; start the holder without --adopt-layouts (its engines publish their layouts again)",
                    n.error().ToString());
      uv_loop_close(&loop);
      return ExitCodeFor(n.error());
    }
    adopted = *n;
  }
  Fingerprint fp;
  fp.Set("layout", "engine");
  fp.Set("backend", store.memory().backend());
  fp.Set("layout_version", std::to_string(kArenaLayoutVersion));
  auto pool = PreparePool(cfg, store.memory().backend(), store.memory().device(), taken);
  if (!pool.ok()) {
    spdlog::error("{}", pool.error().ToString());
    uv_loop_close(&loop);
    return ExitCodeFor(pool.error());
  }
  int exit_code = kHolderExitOk;
  {
    HolderServer server(&loop, &store, fp, ServerOptionsFor(cfg, adopted > 0));
    if (*pool) server.ServeKvPool(&**pool);
    std::string what = " for engine-made layouts";
    if (adopted > 0) what += ", " + std::to_string(adopted) + " adopted from kept fds";
    if (cfg.layout_max_bytes > 0) what += ", at most " + std::to_string(cfg.layout_max_bytes) + " bytes";
    exit_code = Serve(&loop, server, cfg, what + PoolWords(*pool));
  }
  return CloseLoop(&loop, exit_code);
}

void AnnounceReady(int fd, const std::string& socket_path) {
  std::string line = "ready " + socket_path + "\n";
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      spdlog::warn("--ready-fd {}: cannot write the ready line ({}); serving anyway", fd, std::strerror(errno));
      break;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

}  // namespace

Result<std::vector<int>> ParseFdList(const std::string& text) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    bool digits = !item.empty() && item.size() <= 9 &&
                  item.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(item) < 3) {
      return InvalidArgument("--adopt-fds '" + text.substr(0, 200) +
                             "': expected a comma-separated list of inherited fd numbers (3 or more), e.g. 3,4");
    }
    out.push_back(std::stoi(item));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

Status ValidateHolderConfig(const HolderConfig& cfg) {
  bool adopting = !cfg.adopt_manifest.empty() || !cfg.adopt_fds.empty();
  if (cfg.socket_path.empty()) {
    return InvalidArgument("--socket is required: the path of the holder socket, in a private directory");
  }
  auto layout = ParseHolderLayout(cfg.layout);
  if (!layout.ok()) return InvalidArgument("--layout: " + layout.error().message());
  if (*layout == HolderLayout::kEngine) {
    if (!cfg.model_dir.empty()) {
      return InvalidArgument("--model and --layout engine do not go together: engines publish their own "
                             "layouts into this holder; drop --model, or drop --layout engine to load the "
                             "checkpoint");
    }
    if (adopting) {
      return InvalidArgument("--adopt-manifest and --adopt-fds take a checkpoint arena; a holder of engine-made "
                             "layouts (--layout engine) adopts kept layouts with --adopt-layouts: drop them");
    }
  } else {
    if (!cfg.adopt_layouts.empty()) {
      return InvalidArgument("--adopt-layouts takes kept engine-made layouts, for a holder started with --layout "
                             "engine; a checkpoint holder adopts its arena with --adopt-manifest and --adopt-fds");
    }
    if (cfg.layout_max_bytes != 0) {
      return InvalidArgument("--layout-max-bytes caps engine-made layouts, for a holder started with --layout "
                             "engine; drop it");
    }
  }
  if (cfg.layout_max_bytes < 0) {
    return InvalidArgument("--layout-max-bytes " + std::to_string(cfg.layout_max_bytes) +
                           ": expected 0 (no cap) or a number of bytes");
  }
  if (adopting && (cfg.adopt_manifest.empty() || cfg.adopt_fds.empty())) {
    return InvalidArgument("--adopt-manifest and --adopt-fds go together: the arena record and the inherited "
                           "fds it describes");
  }
  if (!adopting && *layout == HolderLayout::kCheckpoint) {
    if (cfg.model_dir.empty()) {
      return InvalidArgument("--model is required: the checkpoint folder (config.json and *.safetensors), "
                             "unless the holder adopts kept fds (--adopt-manifest, --adopt-fds)");
    }
    if (::access(cfg.model_dir.c_str(), F_OK) != 0) {
      return NotFound("--model " + cfg.model_dir + ": no such directory; pass the checkpoint folder");
    }
  }
  if (!cfg.backend.empty() && cfg.backend != "host" && cfg.backend != "cuda") {
    return InvalidArgument("--backend " + cfg.backend + ": expected host or cuda");
  }
  if (cfg.device < 0) return InvalidArgument("--device must be 0 or more (a cuda ordinal)");
  int tp_size = cfg.tp_size.value_or(1);
  int tp_rank = cfg.tp_rank.value_or(0);
  if (tp_size < 1) return InvalidArgument("--tp-size " + std::to_string(tp_size) + ": must be 1 or more");
  if (tp_rank < 0 || tp_rank >= tp_size) {
    return InvalidArgument("--tp-rank " + std::to_string(tp_rank) + " is out of range for --tp-size " +
                           std::to_string(tp_size) + "; ranks count from 0 to tp-size - 1");
  }
  int ep_size = cfg.ep_size.value_or(1);
  int ep_rank = cfg.ep_rank.value_or(0);
  if (ep_size != 1 && ep_size != tp_size) {
    return InvalidArgument("--ep-size " + std::to_string(ep_size) + " with --tp-size " +
                           std::to_string(tp_size) +
                           ": expert parallelism spans the tensor-parallel group; use --ep-size " +
                           std::to_string(tp_size) + " (or 1, experts split by tensor parallelism)");
  }
  if (ep_size > 1 && ep_rank != tp_rank) {
    return InvalidArgument("--ep-rank " + std::to_string(ep_rank) + " differs from --tp-rank " +
                           std::to_string(tp_rank) +
                           "; a holder's expert-parallel rank is its tensor-parallel "
                           "rank: pass --ep-rank " +
                           std::to_string(tp_rank));
  }
  if (ep_size == 1 && ep_rank != 0) {
    return InvalidArgument("--ep-rank " + std::to_string(ep_rank) + " without --ep-size: give --ep-size " +
                           std::to_string(tp_size) + " too, or drop --ep-rank");
  }
  if (cfg.kv_pool_mib < 0 || cfg.kv_pool_mib > kMaxKvPoolMib) {
    return InvalidArgument("--kv-pool-mib " + std::to_string(cfg.kv_pool_mib) +
                           ": expected 0 (no KV pool) to " + std::to_string(kMaxKvPoolMib) + " MiB (16 TiB)");
  }
  if (cfg.read_threads < 1 || cfg.read_threads > 256) {
    return InvalidArgument("--read-threads " + std::to_string(cfg.read_threads) + ": expected 1 to 256");
  }
  if (cfg.handshake_timeout_ms < 1) {
    return InvalidArgument("--handshake-timeout-ms must be positive");
  }
  if (cfg.idle_timeout_ms < 1) {
    return InvalidArgument("--idle-timeout-ms " + std::to_string(cfg.idle_timeout_ms) +
                           ": must be positive (milliseconds a connection may stay without a request)");
  }
  if (cfg.max_connections < 1) {
    return InvalidArgument("--max-connections " + std::to_string(cfg.max_connections) +
                           ": must be 1 or more (open connections at most)");
  }
  if (cfg.ready_fd >= 0 && (cfg.ready_fd <= 2 || !FdIsOpen(cfg.ready_fd))) {
    return InvalidArgument("--ready-fd " + std::to_string(cfg.ready_fd) +
                           ": not an inherited open fd (3 or more); pass the write end of a pipe");
  }
  if (adopting) WSUP_RETURN_IF_ERROR(ParseFdList(cfg.adopt_fds).status());
  return Status::Ok();
}

int RunHolder(const HolderConfig& cfg) {
  Status valid = ValidateHolderConfig(cfg);
  if (!valid.ok()) {
    spdlog::error("{}", valid.error().message());
    return kHolderExitUsage;
  }
  if (cfg.ready_fd >= 0) ::fcntl(cfg.ready_fd, F_SETFD, FD_CLOEXEC);
  ::signal(SIGPIPE, SIG_IGN);
  RaiseOpenFileLimit();

  if (cfg.layout == "engine") return ServeLayouts(cfg);
  bool adopting = !cfg.adopt_manifest.empty();
  auto loaded = adopting ? Adopt(cfg) : LoadFromDisk(cfg);
  if (!loaded.ok()) {
    spdlog::error("{}", loaded.error().ToString());
    return ExitCodeFor(loaded.error());
  }

  const Manifest& m = loaded->arena.manifest();
  auto pool = PreparePool(cfg, m.backend, m.device, TakenFds(cfg));
  if (!pool.ok()) {
    spdlog::error("{}", pool.error().ToString());
    return ExitCodeFor(pool.error());
  }

  uv_loop_t loop;
  uv_loop_init(&loop);
  int exit_code = kHolderExitOk;
  {
    HolderServer server(&loop, loaded->arena, loaded->fingerprint, ServerOptionsFor(cfg, adopting));
    if (*pool) server.ServeKvPool(&**pool);
    exit_code =
        Serve(&loop, server, cfg, std::string(adopting ? " from adopted fds" : "") + PoolWords(*pool));
  }
  return CloseLoop(&loop, exit_code);
}

}  // namespace wsup
