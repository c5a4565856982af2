#include "holder/layout_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "gpu/cuda_driver.h"

namespace wsup {

namespace {

constexpr uint64_t kPageBytes = 4096;
constexpr const char* kCommitFix =
    "; the commit is refused and the lease kept: fix the writer's layout and commit again, or abort";

class HostLayoutMemory final : public LayoutMemory {
 public:
  const char* backend() const override { return "host"; }
  const char* handle() const override { return "memfd"; }
  int device() const override { return -1; }
  std::string device_uuid() const override { return "host"; }
  uint64_t granularity() const override { return kPageBytes; }

  Result<UniqueFd> Allocate(uint64_t bytes, uint64_t* size) override {
    *size = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
    UniqueFd fd(::memfd_create("wsup-layout", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd.valid()) return ErrnoError("layout: memfd_create (needs Linux >= 3.17)", errno);
    if (::ftruncate(fd.get(), static_cast<off_t>(*size)) != 0) {
      return ErrnoError("layout: sizing a memfd to " + std::to_string(*size) + " bytes", errno);
    }
    // The size is fixed from the start: no writer can make a reader's
    // mapping fault (SIGBUS) by shrinking it, nor grow it past the grant.
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      return ErrnoError("layout: sealing a memfd's size (needs Linux >= 3.17 memfd sealing)", errno);
    }
    return fd;
  }

  Status Seal(int fd, uint32_t index) override {
    int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0) return ErrnoError("layout allocation " + std::to_string(index) + ": F_GET_SEALS", errno);
    // A commit refused after some allocations were sealed may come again.
    if ((seals & (F_SEAL_WRITE | F_SEAL_SEAL)) == (F_SEAL_WRITE | F_SEAL_SEAL)) return Status::Ok();
    if (::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) != 0) {
      if (errno == EBUSY) {
        return Refused("layout allocation " + std::to_string(index) +
                       " is still mapped writable (by the writer, or a process it shared the fd with), so it "
                       "cannot be sealed read-only; munmap every writable mapping of it before committing" +
                       std::string(kCommitFix));
      }
      return ErrnoError("layout allocation " + std::to_string(index) + ": sealing it read-only", errno);
    }
    if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL) != 0) {
      return ErrnoError("layout allocation " + std::to_string(index) + ": sealing its seals", errno);
    }
    return Status::Ok();
  }

  Status CheckAdopted(int fd, uint32_t index, uint64_t size) const override {
    const std::string what = "allocation " + std::to_string(index) + " (fd " + std::to_string(fd) + ")";
    struct stat st{};
    if (::fstat(fd, &st) != 0) return ErrnoError(what + ": fstat", errno);
    if (!S_ISREG(st.st_mode)) return Mismatch(what + " is not a memfd");
    if (static_cast<uint64_t>(st.st_size) != size) {
      return Mismatch(what + " has " + std::to_string(st.st_size) + " bytes, the record says " +
                      std::to_string(size));
    }
    int seals = ::fcntl(fd, F_GET_SEALS);
    constexpr int kAll = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
    if (seals < 0 || (seals & kAll) != kAll) {
      // Anyone holding an unsealed fd could still change what readers map.
      return Mismatch(what + " is not a sealed layout memfd (seals " + std::to_string(seals) +
                      "): not the memory of a committed layout");
    }
    return Status::Ok();
  }
};

class CudaLayoutMemory final : public LayoutMemory {
 public:
  CudaLayoutMemory(int device, std::string uuid, uint64_t granularity)
      : device_(device), uuid_(std::move(uuid)), granularity_(granularity) {}

  const char* backend() const override { return "cuda"; }
  const char* handle() const override { return "cuda_vmm"; }
  int device() const override { return device_; }
  std::string device_uuid() const override { return uuid_; }
  uint64_t granularity() const override { return granularity_; }

  Result<UniqueFd> Allocate(uint64_t bytes, uint64_t* size) override {
    *size = (bytes + granularity_ - 1) / granularity_ * granularity_;
    // Kept from the first grant of a lease to the last commit or release:
    // recreating a context for every grant would cost a tenth of a second
    // each.
    if (!ctx_.valid()) {
      auto ctx = cuda::PrimaryContext::Retain(device_);
      if (!ctx.ok()) return ctx.error().With("layout: the holder's device " + std::to_string(device_));
      ctx_ = std::move(ctx).value();
    }
    cuda::ContextScope scope;
    WSUP_RETURN_IF_ERROR(scope.Enter(ctx_));
    auto h = cuda::VmmCreate(device_, *size);
    if (!h.ok()) return h.error().With("layout: a grant of " + std::to_string(*size) + " bytes");
    auto fd = cuda::VmmExport(*h);
    // The exported fd keeps the memory from here on; the holder maps nothing.
    Status released = cuda::VmmRelease(*h);
    if (!fd.ok()) return fd.error().With("layout: exporting a grant");
    if (!released.ok()) return released.error().With("layout: releasing the handle of an exported grant");
    return std::move(fd).value();
  }

  // VMM memory cannot be mapped read-only on the device that owns it.
  Status Seal(int, uint32_t) override { return Status::Ok(); }

  // The driver tells neither an allocation's size nor its device from its
  // fd without importing it into a context, so an adoption checks only that
  // the fd is open and no regular file (a memfd or a file kept by mistake);
  // a reader's import then fails with the driver's error if it is not VMM
  // memory, and maps exactly the sizes of the manifest's allocations.
  Status CheckAdopted(int fd, uint32_t index, uint64_t) const override {
    const std::string what = "allocation " + std::to_string(index) + " (fd " + std::to_string(fd) + ")";
    struct stat st{};
    if (::fstat(fd, &st) != 0) return ErrnoError(what + ": fstat", errno);
    if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) {
      return Mismatch(what + " is a file, not the fd of a CUDA VMM allocation: not the memory of a committed "
                             "cuda layout");
    }
    return Status::Ok();
  }

  void Idle() override { ctx_ = cuda::PrimaryContext(); }

 private:
  int device_;
  std::string uuid_;
  uint64_t granularity_;
  cuda::PrimaryContext ctx_;  // while some layout is being written
};

}  // namespace

std::unique_ptr<LayoutMemory> MakeHostLayoutMemory() { return std::make_unique<HostLayoutMemory>(); }

Result<std::unique_ptr<LayoutMemory>> MakeCudaLayoutMemory(int device) {
  WSUP_RETURN_IF_ERROR(cuda::Init());
  WSUP_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::GetDeviceInfo(device));
  if (!info.vmm_supported || !info.posix_fd_supported) {
    return Unavailable("layout: CUDA device " + std::to_string(device) + " (" + info.name +
                       ") does not support VMM allocations exportable as POSIX fds: use --backend host, or a "
                       "GPU and driver that do (compute capability >= 6.0, Linux driver >= 450)");
  }
  WSUP_ASSIGN_OR_RETURN(uint64_t gran, cuda::VmmGranularity(device));
  std::unique_ptr<LayoutMemory> m = std::make_unique<CudaLayoutMemory>(device, info.uuid, gran);
  return m;
}

LayoutStore::LayoutStore(std::unique_ptr<LayoutMemory> memory, uint64_t max_bytes)
    : memory_(std::move(memory)), max_bytes_(max_bytes) {}

std::string LayoutStore::Key(const Fingerprint& fp) {
  // The JSON object's keys are sorted: one fingerprint, one key, whatever
  // order its fields came in.
  return fp.ToJson().dump();
}

Layout* LayoutStore::Find(const Fingerprint& fp) {
  auto it = by_key_.find(Key(fp));
  return it == by_key_.end() ? nullptr : Get(it->second);
}

Layout* LayoutStore::Get(uint64_t id) {
  auto it = layouts_.find(id);
  return it == layouts_.end() ? nullptr : it->second.get();
}

Result<Layout*> LayoutStore::Begin(const Fingerprint& fp, uint64_t writer, const std::string& writer_name,
                                   int64_t writer_pid, uint64_t now_ms) {
  std::string key = Key(fp);
  if (by_key_.count(key) != 0) {
    return Internal("layout: a lease was asked for a fingerprint that already has a layout; this is a bug");
  }
  auto l = std::make_unique<Layout>();
  l->id = next_id_++;
  l->fingerprint = fp;
  l->writer = writer;
  l->writer_name = writer_name;
  l->writer_pid = writer_pid;
  l->began_ms = now_ms;
  l->manifest.backend = memory_->backend();
  l->manifest.device = memory_->device();
  l->manifest.device_uuid = memory_->device_uuid();
  Layout* raw = l.get();
  by_key_[key] = raw->id;
  layouts_[raw->id] = std::move(l);
  spdlog::info("layout {}: lease granted to '{}' (pid {}): writing", raw->id, writer_name, writer_pid);
  return raw;
}

LeaseMsg LayoutStore::Lease(const Layout& l) const {
  LeaseMsg m;
  m.layout = l.id;
  m.fingerprint = l.fingerprint;
  m.backend = memory_->backend();
  m.device = memory_->device();
  m.device_uuid = memory_->device_uuid();
  m.alignment = Manifest::kTensorAlignment;
  m.granularity = memory_->granularity();
  m.max_allocations = kMaxGrants;
  return m;
}

Result<LayoutStore::Grant> LayoutStore::Allocate(Layout* l, uint64_t bytes) {
  if (l->state != LayoutState::kWriting) {
    return Internal("layout " + std::to_string(l->id) + ": alloc on a layout that is not being written");
  }
  if (bytes == 0 || bytes > kMaxGrantBytes) {
    return InvalidArgument("layout " + std::to_string(l->id) + ": an allocation of " + std::to_string(bytes) +
                           " bytes; ask for 1 byte to 1 TiB at a time");
  }
  if (l->fds.size() >= kMaxGrants) {
    return InvalidArgument("layout " + std::to_string(l->id) + ": already " + std::to_string(l->fds.size()) +
                           " allocations, the most one layout may have; ask for fewer, larger ones");
  }
  if (max_bytes_ > 0) {
    const uint64_t g = memory_->granularity();
    const uint64_t asked = (bytes + g - 1) / g * g;
    const uint64_t held = granted_bytes();
    if (held + asked > max_bytes_) {
      return Refused("layout " + std::to_string(l->id) + ": an allocation of " + std::to_string(bytes) + " bytes (" +
                     std::to_string(asked) + " as granted) would take this holder's layout memory past its cap of " +
                     std::to_string(max_bytes_) +
                     " bytes (weight_cache.layout_max_bytes, wsup-holder --layout-max-bytes): it holds " +
                     std::to_string(held) + " bytes in writing and committed layouts and was asked for " +
                     std::to_string(asked) + " more; raise weight_cache.layout_max_bytes, or remove unused "
                     "layouts (`wsup stop` releases every kept layout); the lease is kept: commit what was "
                     "granted, ask for less, or abort");
    }
  }
  Grant g;
  uint64_t size = 0;
  WSUP_ASSIGN_OR_RETURN(UniqueFd fd, memory_->Allocate(bytes, &size));
  WSUP_ASSIGN_OR_RETURN(g.fd, fd.Dup());
  g.msg.alloc = static_cast<uint32_t>(l->fds.size());
  g.msg.size = size;
  g.msg.handle = memory_->handle();
  l->fds.push_back(std::move(fd));
  l->manifest.allocations.push_back(ManifestAllocation{size});
  spdlog::debug("layout {}: allocation {} of {} bytes granted", l->id, g.msg.alloc, size);
  return g;
}

Status LayoutStore::Commit(Layout* l, Manifest m, const std::string& layout_hash) {
  auto refuse = [&](Error e) -> Status {
    Move(l, LayoutEvent::kCommitRefused, e.message());
    return e;
  };
  const Manifest& held = l->manifest;
  if (m.backend != held.backend || m.device != held.device || m.device_uuid != held.device_uuid) {
    return refuse(InvalidArgument("the commit's manifest names backend " + m.backend.substr(0, 16) + ", device " +
                                  std::to_string(m.device) + " (" + m.device_uuid.substr(0, 64) +
                                  ") but the lease is for backend " + held.backend + ", device " +
                                  std::to_string(held.device) + " (" + held.device_uuid + ")" + kCommitFix));
  }
  if (held.allocations.empty()) {
    return refuse(InvalidArgument(
        std::string("a commit before any allocation: ask for memory (alloc), write the tensors into it, then "
                    "commit") +
        kCommitFix));
  }
  if (m.allocations.size() != held.allocations.size()) {
    return refuse(InvalidArgument("the commit's manifest has " + std::to_string(m.allocations.size()) +
                                  " allocations but the holder granted " + std::to_string(held.allocations.size()) +
                                  "; list every grant, in grant order" + kCommitFix));
  }
  for (size_t i = 0; i < m.allocations.size(); ++i) {
    if (m.allocations[i].size != held.allocations[i].size) {
      return refuse(InvalidArgument("the commit's manifest gives allocation " + std::to_string(i) + " " +
                                    std::to_string(m.allocations[i].size) + " bytes but the holder granted " +
                                    std::to_string(held.allocations[i].size) + kCommitFix));
    }
  }
  if (m.entries.empty()) {
    return refuse(InvalidArgument(std::string("the commit names no tensors") + kCommitFix));
  }
  Status valid = m.Validate(nullptr, kCommitFix);
  if (!valid.ok()) return refuse(valid.error().With("commit refused"));
  std::string hash = LayoutHash(m.entries);
  if (hash != layout_hash) {
    return refuse(Mismatch("commit refused: its layout_hash " + layout_hash.substr(0, 64) +
                           " is not the hash of its entries (" + hash +
                           "); compute it with LayoutHash() over the entries sent" + kCommitFix));
  }
  auto table = EncodeTensorTable(m.entries);
  if (!table.ok()) return refuse(table.error().With("commit refused"));
  for (size_t i = 0; i < l->fds.size(); ++i) {
    Status sealed = memory_->Seal(l->fds[i].get(), static_cast<uint32_t>(i));
    if (!sealed.ok()) return refuse(sealed.error().With("commit refused"));
  }
  l->table_manifest = ManifestHeaderToJson(m, table->size());
  l->table = std::make_shared<const std::string>(std::move(table).value());
  l->json_manifest = ManifestToJson(m);
  l->manifest = std::move(m);
  l->layout_hash = hash;
  Move(l, LayoutEvent::kCommit,
       std::to_string(l->manifest.entries.size()) + " tensors, " + std::to_string(l->manifest.total_bytes()) +
           " bytes in " + std::to_string(l->fds.size()) + " allocations, hash " + hash.substr(0, 16));
  l->writer = 0;
  return Status::Ok();
}

Result<Layout*> LayoutStore::Adopt(LayoutRecord rec, std::vector<UniqueFd> fds, uint64_t now_ms) {
  const std::string named = DescribeLayout(rec.id, rec.layout_hash);
  const std::string fix =
      "; it is not adopted and its kept memory is released: the next engine publishes it again";
  const Manifest& m = rec.manifest;
  if (rec.id == 0) return InvalidArgument("an adopted layout needs an id of 1 or more" + fix);
  if (layouts_.count(rec.id) != 0) {
    return InvalidArgument(named + ": another adopted layout has id " + std::to_string(rec.id) +
                           "; the record names it twice" + fix);
  }
  if (!IsEngineLayout(rec.fingerprint)) {
    return InvalidArgument(named + ": its fingerprint names no engine-made layout" + fix);
  }
  if (by_key_.count(Key(rec.fingerprint)) != 0) {
    return InvalidArgument(named + ": layout " + std::to_string(by_key_[Key(rec.fingerprint)]) +
                           " has the same fingerprint; a holder keeps one layout per fingerprint" + fix);
  }
  if (m.backend != memory_->backend() || m.device != memory_->device() || m.device_uuid != memory_->device_uuid()) {
    return Mismatch(named + ": its manifest names backend " + m.backend.substr(0, 16) + ", device " +
                    std::to_string(m.device) + " (" + m.device_uuid.substr(0, 64) + "), this holder keeps " +
                    memory_->backend() + ", device " + std::to_string(memory_->device()) + fix);
  }
  if (fds.size() != m.allocations.size()) {
    return Mismatch(named + ": " + std::to_string(fds.size()) + " fds for " + std::to_string(m.allocations.size()) +
                    " allocations; the record disagrees with its fds" + fix);
  }
  if (m.allocations.size() > kMaxGrants) {
    return InvalidArgument(named + ": " + std::to_string(m.allocations.size()) +
                           " allocations, more than a layout may have (" + std::to_string(kMaxGrants) + ")" + fix);
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    Status ok = memory_->CheckAdopted(fds[i].get(), static_cast<uint32_t>(i), m.allocations[i].size);
    if (!ok.ok()) {
      return Error(ok.error().code(), named + ": " + ok.error().message() +
                                          "; the record disagrees with its fds" + fix);
    }
  }
  // The record's reader checked these already; a store trusts no caller.
  Status valid = m.Validate();
  if (!valid.ok()) return valid.error().With(named + fix);
  if (m.entries.empty()) return InvalidArgument(named + ": its manifest names no tensors" + fix);
  if (LayoutHash(m.entries) != rec.layout_hash) {
    return Mismatch(named + ": its layout_hash is not the hash of its entries" + fix);
  }
  auto table = EncodeTensorTable(m.entries);
  if (!table.ok()) return table.error().With(named + fix);

  auto l = std::make_unique<Layout>();
  l->id = rec.id;
  l->fingerprint = std::move(rec.fingerprint);
  l->state = LayoutState::kCommitted;
  l->writer_name = "(adopted)";
  l->fds = std::move(fds);
  l->table_manifest = ManifestHeaderToJson(rec.manifest, table->size());
  l->table = std::make_shared<const std::string>(std::move(table).value());
  l->json_manifest = ManifestToJson(rec.manifest);
  l->manifest = std::move(rec.manifest);
  l->layout_hash = std::move(rec.layout_hash);
  l->began_ms = now_ms;
  l->adopted = true;
  Layout* raw = l.get();
  by_key_[Key(raw->fingerprint)] = raw->id;
  layouts_[raw->id] = std::move(l);
  next_id_ = std::max(next_id_, raw->id + 1);
  spdlog::info("layout {}: adopted from kept fds: committed ({} tensors, {} bytes in {} allocations, hash {})",
               raw->id, raw->manifest.entries.size(), raw->manifest.total_bytes(), raw->fds.size(),
               raw->layout_hash.substr(0, 16));
  if (max_bytes_ > 0 && granted_bytes() > max_bytes_) {
    spdlog::warn("adopted layouts hold {} bytes, past the cap of {} bytes (--layout-max-bytes): they are kept (the "
                 "memory exists already), and new grants are refused until the layout memory is under the cap",
                 granted_bytes(), max_bytes_);
  }
  return raw;
}

std::vector<CommittedLayout> LayoutStore::Committed() const {
  std::vector<CommittedLayout> out;
  for (const auto& [id, l] : layouts_) {
    if (l->state != LayoutState::kCommitted) continue;
    out.push_back(CommittedLayout{id, l->layout_hash, l->fds.size()});
  }
  return out;
}

LayoutRecord LayoutStore::Record(const Layout& l) {
  LayoutRecord r;
  r.id = l.id;
  r.layout_hash = l.layout_hash;
  r.fingerprint = l.fingerprint;
  r.manifest = l.manifest;
  return r;
}

std::deque<uint64_t> LayoutStore::Release(Layout* l, LayoutEvent event, const std::string& cause) {
  Move(l, event, cause);
  std::deque<uint64_t> waiters = std::move(l->waiters);
  if (l->state != LayoutState::kReleased) return waiters;  // a committed layout stays
  by_key_.erase(Key(l->fingerprint));
  layouts_.erase(l->id);  // closes the fds: the memory goes once the writer's are gone too
  IdleIfNoWriter();
  return waiters;
}

void LayoutStore::IdleIfNoWriter() {
  for (const auto& [id, l] : layouts_) {
    if (l->state == LayoutState::kWriting) return;
  }
  memory_->Idle();
}

void LayoutStore::Move(Layout* l, LayoutEvent event, const std::string& cause) {
  auto t = NextLayoutTransition(l->state, event);
  if (!t) {
    spdlog::error("layout {}: {} ({}); this is a bug", l->id, kLayoutNames.Refused(l->state, event), cause);
    return;
  }
  auto log = t->action == LayoutAction::kRefuse ? spdlog::level::warn : spdlog::level::info;
  spdlog::log(log, "layout {}: {} {}", l->id, kLayoutNames.Move(*t), cause);
  l->state = t->to;
}

std::vector<LayoutInfo> LayoutStore::Info(uint64_t now_ms) const {
  std::vector<LayoutInfo> out;
  for (const auto& [id, l] : layouts_) {
    LayoutInfo i;
    i.id = id;
    i.state = LayoutStateName(l->state);
    i.fingerprint = l->fingerprint;
    i.arena_bytes = l->manifest.arena_bytes();
    i.allocations = l->manifest.allocations.size();
    if (l->state == LayoutState::kCommitted) {
      i.tensors = l->manifest.entries.size();
      i.bytes = l->manifest.total_bytes();
      i.layout_hash = l->layout_hash;
    } else {
      i.bytes = i.arena_bytes;
      i.writer = l->writer_name;
      i.writer_pid = l->writer_pid;
    }
    i.waiters = l->waiters.size();
    i.attaches = l->attaches;
    i.adopted = l->adopted;
    i.age_ms = now_ms > l->began_ms ? now_ms - l->began_ms : 0;
    out.push_back(std::move(i));
  }
  return out;
}

uint64_t LayoutStore::granted_bytes() const {
  uint64_t sum = 0;
  for (const auto& [id, l] : layouts_) sum += l->manifest.arena_bytes();
  return sum;
}

}  // namespace wsup
