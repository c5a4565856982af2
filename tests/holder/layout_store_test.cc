// The engine-made layouts of a holder, in process: the state table
// (holder/layout_fsm.h) and the store (holder/layout_store.h) with its host
// memory: grants are sized and sealed, commits are checked (and refused
// with what to fix), a committed layout is sealed read-only, a released one
// frees its memory.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>
#include <functional>
#include <set>
#include <tuple>

#include "holder/layout_fsm.h"
#include "holder/layout_store.h"
#include "tests/text_check.h"
#include "tests/transition_table_check.h"
#include "tests/wire/wire_check.h"

namespace wsup {
namespace {

using S = LayoutState;
using E = LayoutEvent;
using A = LayoutAction;

using test::Has;

void Step(S* s, E e, S want, A act) {
  auto t = NextLayoutTransition(*s, e);
  INFO(LayoutStateName(*s) << " --" << LayoutEventName(e) << "-->");
  REQUIRE(t.has_value());
  CHECK(t->to == want);
  CHECK(t->action == act);
  *s = t->to;
}

TEST_CASE("layout table: each (state, event) appears at most once, and released is final", "[holder][layout]") {
  size_t n = 0;
  const LayoutTransition* t = LayoutTable(&n);
  REQUIRE(n >= 5);
  test::CheckPairsOnce(t, n, LayoutStateName, LayoutEventName, [](const LayoutTransition& r) { CHECK(r.from != S::kReleased); });
  for (E e : {E::kCommit, E::kCommitRefused, E::kAbort, E::kWriterLost}) {
    CHECK_FALSE(NextLayoutTransition(S::kReleased, e).has_value());
  }
  // A committed layout is never committed again, aborted or released.
  for (E e : {E::kCommit, E::kCommitRefused, E::kAbort}) {
    CHECK_FALSE(NextLayoutTransition(S::kCommitted, e).has_value());
  }
}

TEST_CASE("layout table: refused commits keep the lease - a commit serves - loss or abort releases",
          "[holder][layout]") {
  S s = S::kWriting;
  Step(&s, E::kCommitRefused, S::kWriting, A::kRefuse);
  Step(&s, E::kCommit, S::kCommitted, A::kSealAndServe);
  Step(&s, E::kWriterLost, S::kCommitted, A::kNone);
  S w = S::kWriting;
  Step(&w, E::kWriterLost, S::kReleased, A::kRelease);
  S a = S::kWriting;
  Step(&a, E::kAbort, S::kReleased, A::kRelease);
  CHECK(std::string(LayoutStateName(S::kCommitted)) == "committed");
  CHECK(std::string(LayoutActionName(A::kSealAndServe)) == "seal_and_serve");
}

Fingerprint Fp(const std::string& revision) {
  Fingerprint fp;
  fp.Set("revision", revision);
  AddEngineLayout(&fp, EngineLayoutId{"test-engine", "1", "none"});
  return fp;
}

// Writes `bytes` of `value` at `offset` of a grant, through a mapping that
// is gone again afterwards (a commit needs every writable mapping gone).
void Fill(int fd, uint64_t size, uint64_t offset, uint64_t bytes, uint8_t value) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  std::memset(static_cast<uint8_t*>(p) + offset, value, bytes);
  ::munmap(p, size);
}

Manifest Header(const Layout& l) {
  Manifest m = test::HostManifest(l.manifest.allocations);
  return m;
}

TEST_CASE("layout store: grants, a checked and sealed commit, and a release that frees", "[holder][layout]") {
  LayoutStore store(MakeHostLayoutMemory());
  Fingerprint fp = Fp("r1");
  CHECK(store.Find(fp) == nullptr);
  auto l = store.Begin(fp, 11, "writer", 123, 1000);
  REQUIRE(l.ok());
  CHECK(store.Find(fp) == *l);
  CHECK(store.Find(Fp("r2")) == nullptr);
  CHECK(store.Lease(**l).alignment == 256);

  auto g = store.Allocate(*l, 5000);
  REQUIRE(g.ok());
  CHECK(g->msg.size == 8192);  // rounded up to the page
  CHECK(g->msg.alloc == 0);
  CHECK(g->msg.handle == "memfd");
  struct stat st{};
  REQUIRE(::fstat(g->fd.get(), &st) == 0);
  CHECK(st.st_size == 8192);
  // The size is sealed from the start; writes are allowed until the commit.
  int seals = ::fcntl(g->fd.get(), F_GET_SEALS);
  CHECK((seals & (F_SEAL_GROW | F_SEAL_SHRINK)) == (F_SEAL_GROW | F_SEAL_SHRINK));
  CHECK((seals & F_SEAL_WRITE) == 0);
  CHECK(::ftruncate(g->fd.get(), 4096) != 0);
  CHECK(store.granted_bytes() == 8192);
  CHECK_FALSE(store.Allocate(*l, 0).ok());
  CHECK_FALSE(store.Allocate(*l, (1ull << 40) + 1).ok());

  Fill(g->fd.get(), 8192, 0, 64, 7);
  Manifest m = Header(**l);
  m.entries = {{"w", "F32", {4, 4}, 0, 0, 64}};
  REQUIRE(store.Commit(*l, m, LayoutHash(m.entries)).ok());
  CHECK((*l)->state == LayoutState::kCommitted);
  CHECK((*l)->table != nullptr);
  seals = ::fcntl(g->fd.get(), F_GET_SEALS);
  CHECK((seals & (F_SEAL_WRITE | F_SEAL_SEAL)) == (F_SEAL_WRITE | F_SEAL_SEAL));
  CHECK(::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd.get(), 0) == MAP_FAILED);
  auto info = store.Info(1500);
  REQUIRE(info.size() == 1);
  CHECK(info[0].state == "committed");
  CHECK(info[0].tensors == 1);
  CHECK(info[0].bytes == 64);
  CHECK(info[0].age_ms == 500);

  // Another fingerprint: its own layout, released on abort.
  auto l2 = store.Begin(Fp("r2"), 12, "other", 124, 2000);
  REQUIRE(l2.ok());
  CHECK((*l2)->id != (*l)->id);
  auto g2 = store.Allocate(*l2, 4096);
  REQUIRE(g2.ok());
  (*l2)->waiters = {5, 6};
  auto waiters = store.Release(*l2, LayoutEvent::kAbort, "test");
  CHECK(waiters == std::deque<uint64_t>{5, 6});
  CHECK(store.Find(Fp("r2")) == nullptr);
  CHECK(store.size() == 1);
  CHECK(store.granted_bytes() == 8192);
}

TEST_CASE("layout store: bad commits are refused with what to fix, and the lease is kept", "[holder][layout]") {
  LayoutStore store(MakeHostLayoutMemory());
  auto l = store.Begin(Fp("r"), 1, "writer", 1, 0);
  REQUIRE(l.ok());
  Manifest none = Header(**l);
  none.entries = {{"w", "F32", {1}, 0, 0, 4}};
  Status early = store.Commit(*l, none, LayoutHash(none.entries));
  REQUIRE_FALSE(early.ok());
  CHECK(Has(early.error().message(), "a commit before any allocation"));

  auto g = store.Allocate(*l, 4096);
  REQUIRE(g.ok());
  struct Case {
    const char* what;
    std::function<void(Manifest&)> make;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"overlap",
       [](Manifest& m) { m.entries = {{"a", "F32", {64}, 0, 0, 256}, {"b", "F32", {64}, 0, 0, 256}}; },
       "overlaps"},
      {"out of bounds", [](Manifest& m) { m.entries = {{"a", "F32", {1024}, 0, 256, 4096}}; },
       "ends past allocation 0 of 4096 bytes"},
      {"unknown allocation", [](Manifest& m) { m.entries = {{"a", "F32", {1}, 1, 0, 4}}; },
       "field 'alloc' = 1"},
      {"unknown dtype", [](Manifest& m) { m.entries = {{"a", "F33", {4}, 0, 0, 16}}; },
       "'F33' is not a known safetensors dtype"},
      {"duplicate name",
       [](Manifest& m) { m.entries = {{"a", "F32", {4}, 0, 0, 16}, {"a", "F32", {4}, 0, 256, 16}}; },
       "is a duplicate of entry 0"},
      {"size against shape", [](Manifest& m) { m.entries = {{"a", "BF16", {4, 4}, 0, 0, 64}}; },
       "but shape x dtype size (BF16) = 32"},
      {"size against strides",
       [](Manifest& m) {
         ManifestEntry e{"a", "F32", {4, 4}, 0, 0, 64};
         e.strides = {8, 1};
         m.entries = {e};
       },
       "span 112"},
      {"misaligned", [](Manifest& m) { m.entries = {{"a", "F32", {4}, 0, 100, 16}}; }, "not a multiple of 256"},
      {"no tensors", [](Manifest& m) { m.entries.clear(); }, "names no tensors"},
      {"allocation size", [](Manifest& m) {
         m.allocations[0].size = 8192;
         m.entries = {{"a", "F32", {4}, 0, 0, 16}};
       },
       "granted 4096"},
      {"another backend", [](Manifest& m) {
         m.backend = "cuda";
         m.entries = {{"a", "F32", {4}, 0, 0, 16}};
       },
       "the lease is for backend host"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    Manifest m = Header(**l);
    c.make(m);
    Status st = store.Commit(*l, m, LayoutHash(m.entries));
    REQUIRE_FALSE(st.ok());
    INFO(st.error().message());
    CHECK(Has(st.error().message(), c.says));
    CHECK(Has(st.error().message(), "the lease kept"));
    CHECK((*l)->state == LayoutState::kWriting);
  }
  // A wrong hash.
  Manifest m = Header(**l);
  m.entries = {{"a", "F32", {4}, 0, 0, 16}};
  Status st = store.Commit(*l, m, std::string(64, '0'));
  REQUIRE_FALSE(st.ok());
  CHECK(Has(st.error().message(), "is not the hash of its entries"));
  // A writable mapping still open: the seal is refused until it is gone.
  void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd.get(), 0);
  REQUIRE(p != MAP_FAILED);
  st = store.Commit(*l, m, LayoutHash(m.entries));
  REQUIRE_FALSE(st.ok());
  CHECK(Has(st.error().message(), "still mapped writable"));
  CHECK((*l)->state == LayoutState::kWriting);
  ::munmap(p, 4096);
  // Fixed: the same commit passes.
  REQUIRE(store.Commit(*l, m, LayoutHash(m.entries)).ok());
  CHECK((*l)->state == LayoutState::kCommitted);
}


// A store with one committed layout of `bytes` (one grant, one tensor).
Layout* Committed(LayoutStore& store, const Fingerprint& fp, uint64_t bytes = 4096) {
  auto l = store.Begin(fp, 1, "writer", 1, 0);
  REQUIRE(l.ok());
  auto g = store.Allocate(*l, bytes);
  REQUIRE(g.ok());
  Fill(g->fd.get(), g->msg.size, 0, 64, 9);
  Manifest m = Header(**l);
  m.entries = {{"w", "F32", {16}, 0, 0, 64}};
  REQUIRE(store.Commit(*l, m, LayoutHash(m.entries)).ok());
  return *l;
}

std::vector<UniqueFd> DupAll(const Layout& l) {
  std::vector<UniqueFd> out;
  for (const UniqueFd& f : l.fds) out.push_back(f.Dup().value());
  return out;
}

TEST_CASE("layout store: the cap refuses a grant past it naming the cap and the fix - the lease is kept",
          "[holder][layout]") {
  LayoutStore store(MakeHostLayoutMemory(), 12288);
  CHECK(store.max_bytes() == 12288);
  auto l = store.Begin(Fp("r1"), 1, "writer", 1, 0);
  REQUIRE(l.ok());
  REQUIRE(store.Allocate(*l, 5000).ok());  // 8192 granted
  auto fits = store.Allocate(*l, 4096);    // 12288: exactly the cap
  REQUIRE(fits.ok());
  auto over = store.Allocate(*l, 1);
  test::CheckFailed(over, Code::kRefused,
                    {"past its cap of 12288 bytes", "weight_cache.layout_max_bytes",
                     "it holds 12288 bytes in writing and committed layouts", "asked for 4096 more",
                     "raise weight_cache.layout_max_bytes, or remove unused layouts"});
  CHECK((*l)->state == LayoutState::kWriting);
  CHECK((*l)->fds.size() == 2);
  CHECK(store.granted_bytes() == 12288);

  // Another writer is bounded by the same total.
  auto other = store.Begin(Fp("r2"), 2, "other", 2, 0);
  REQUIRE(other.ok());
  auto refused = store.Allocate(*other, 1);
  REQUIRE_FALSE(refused.ok());
  CHECK(Has(refused.error().message(), "layout " + std::to_string((*other)->id)));
  // The first writer aborts: its bytes are free for the other.
  store.Release(*l, LayoutEvent::kAbort, "test");
  CHECK(store.granted_bytes() == 0);
  CHECK(store.Allocate(*other, 12288).ok());
  CHECK_FALSE(store.Allocate(*other, 1).ok());

  // No cap: nothing is refused for its size below a grant's bound.
  LayoutStore open(MakeHostLayoutMemory());
  CHECK(open.max_bytes() == 0);
  auto w = open.Begin(Fp("r"), 1, "w", 1, 0);
  REQUIRE(w.ok());
  CHECK(open.Allocate(*w, 1 << 20).ok());
  CHECK(open.Allocate(*w, 1 << 20).ok());
}

TEST_CASE("layout store: a kept layout is adopted committed under its id - records that disagree with their fds "
          "are refused naming the layout",
          "[holder][layout]") {
  LayoutStore first(MakeHostLayoutMemory());
  first.Begin(Fp("writing"), 9, "w", 9, 0).value();  // never kept: only committed layouts are listed
  Layout* l = Committed(first, Fp("r1"), 5000);
  auto listed = first.Committed();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].id == l->id);
  CHECK(listed[0].layout_hash == l->layout_hash);
  CHECK(listed[0].allocations == 1);
  LayoutRecord rec = LayoutStore::Record(*l);
  CHECK(rec.id == l->id);
  CHECK(rec.manifest.allocations[0].size == 8192);

  LayoutStore next(MakeHostLayoutMemory());
  auto adopted = next.Adopt(rec, DupAll(*l), 500);
  REQUIRE(adopted.ok());
  Layout* a = *adopted;
  CHECK(a->id == l->id);
  CHECK(a->state == LayoutState::kCommitted);
  CHECK(a->adopted);
  CHECK(a->layout_hash == l->layout_hash);
  CHECK(a->table != nullptr);
  CHECK(next.Find(Fp("r1")) == a);
  CHECK(next.granted_bytes() == 8192);
  auto info = next.Info(700);
  REQUIRE(info.size() == 1);
  CHECK(info[0].state == "committed");
  CHECK(info[0].adopted);
  CHECK(info[0].tensors == 1);
  CHECK(info[0].age_ms == 200);
  // A new lease never reuses an adopted id.
  auto fresh = next.Begin(Fp("r2"), 3, "w", 3, 0);
  REQUIRE(fresh.ok());
  CHECK((*fresh)->id > a->id);

  auto refuses = [&](LayoutRecord r, std::vector<UniqueFd> fds, const std::string& says) {
    LayoutStore store(MakeHostLayoutMemory());
    if (says.find("same fingerprint") != std::string::npos) {
      REQUIRE(store.Adopt(LayoutStore::Record(*l), DupAll(*l), 0).ok());
      r.id += 100;
    }
    size_t before = store.size();
    auto got = store.Adopt(std::move(r), std::move(fds), 0);
    REQUIRE_FALSE(got.ok());
    INFO(got.error().message());
    CHECK(Has(got.error().message(), says));
    CHECK(Has(got.error().message(), "it is not adopted"));
    CHECK(store.size() == before);
  };
  auto memfd = [](uint64_t size, bool sealed) {
    UniqueFd fd(::memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(fd.valid());
    REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(size)) == 0);
    if (sealed) REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) == 0);
    std::vector<UniqueFd> v;
    v.push_back(std::move(fd));
    return v;
  };
  const std::string named = "layout " + std::to_string(l->id) + " (hash " + l->layout_hash.substr(0, 16) + ")";
  refuses(rec, {}, named + ": 0 fds for 1 allocations; the record disagrees with its fds");
  refuses(rec, memfd(4096, true), "has 4096 bytes, the record says 8192; the record disagrees with its fds");
  refuses(rec, memfd(8192, false), "is not a sealed layout memfd");
  {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    ::close(p[1]);
    std::vector<UniqueFd> v;
    v.emplace_back(p[0]);
    refuses(rec, std::move(v), "is not a memfd");
  }
  LayoutRecord bad_hash = rec;
  bad_hash.layout_hash = std::string(64, '0');
  refuses(bad_hash, DupAll(*l), "is not the hash of its entries");
  LayoutRecord cuda = rec;
  cuda.manifest.backend = "cuda";
  refuses(cuda, DupAll(*l), "names backend cuda");
  LayoutRecord plain = rec;
  plain.fingerprint = Fingerprint();
  refuses(plain, DupAll(*l), "names no engine-made layout");
  refuses(rec, DupAll(*l), "has the same fingerprint");
  LayoutRecord twice = rec;
  {
    LayoutStore store(MakeHostLayoutMemory());
    REQUIRE(store.Adopt(rec, DupAll(*l), 0).ok());
    twice.fingerprint = Fp("r9");
    auto got = store.Adopt(twice, DupAll(*l), 0);
    REQUIRE_FALSE(got.ok());
    CHECK(Has(got.error().message(), "another adopted layout has id"));
  }
}

TEST_CASE("layout store: adoption is never refused for the cap - grants are, until under it", "[holder][layout]") {
  LayoutStore first(MakeHostLayoutMemory());
  Layout* l = Committed(first, Fp("r1"), 8192);
  LayoutStore capped(MakeHostLayoutMemory(), 4096);
  REQUIRE(capped.Adopt(LayoutStore::Record(*l), DupAll(*l), 0).ok());
  CHECK(capped.granted_bytes() == 8192);
  auto w = capped.Begin(Fp("r2"), 2, "w", 2, 0);
  REQUIRE(w.ok());
  auto g = capped.Allocate(*w, 1);
  REQUIRE_FALSE(g.ok());
  CHECK(Has(g.error().message(), "it holds 8192 bytes"));
}

}  // namespace
}  // namespace wsup
