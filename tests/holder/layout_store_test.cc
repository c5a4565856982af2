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

namespace wsup {
namespace {

using S = LayoutState;
using E = LayoutEvent;
using A = LayoutAction;

bool Has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

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
  std::set<std::tuple<int, int>> seen;
  for (size_t i = 0; i < n; ++i) {
    INFO(LayoutStateName(t[i].from) << " x " << LayoutEventName(t[i].event));
    CHECK(seen.insert({static_cast<int>(t[i].from), static_cast<int>(t[i].event)}).second);
    CHECK(t[i].from != S::kReleased);
  }
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
  Manifest m;
  m.backend = "host";
  m.device = -1;
  m.device_uuid = "host";
  m.allocations = l.manifest.allocations;
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

}  // namespace
}  // namespace wsup
