// The carving allocator (client/carver.h) against a fake grant source:
// first fit, alignment, coalescing inside a grant and never across two,
// chunked grants, reuse of freed ranges, and its errors.
#include "client/carver.h"

#include <catch2/catch.hpp>
#include <set>
#include <vector>

namespace wsup {
namespace {

// Hands out grants at chosen addresses and remembers what was asked.
struct FakeSource {
  uint64_t next = 1ull << 20;
  uint64_t gap = 0;    // bytes left between one grant and the next (0: back to back)
  uint64_t round = 1;  // grants are rounded up to this
  std::vector<uint64_t> asked;
  int fail_after = -1;  // grants before the source refuses (-1: never)

  Carver::GrantSource Fn() {
    return [this](uint64_t bytes) -> Result<Carver::Grant> {
      asked.push_back(bytes);
      if (fail_after >= 0 && static_cast<int>(asked.size()) > fail_after) {
        return Unavailable("the holder is out of memory (fake)");
      }
      Carver::Grant g;
      g.alloc = static_cast<uint32_t>(asked.size() - 1);
      g.base = next;
      g.size = (bytes + round - 1) / round * round;
      next += g.size + gap;
      return g;
    };
  }
};

TEST_CASE("carver: blocks are aligned, first fit, and come from one chunk until it is full", "[carver]") {
  FakeSource src;
  Carver c(src.Fn(), 4096, 512);
  auto a = c.Allocate(1);
  auto b = c.Allocate(513);
  auto d = c.Allocate(512);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(d.ok());
  CHECK(*a == (1u << 20));
  CHECK(*b == *a + 512);   // 1 byte takes one 512-byte unit
  CHECK(*d == *b + 1024);  // 513 bytes take two
  CHECK(src.asked == std::vector<uint64_t>{4096});
  CHECK(c.BlockSize(*b) == 1024);
  CHECK(c.BlockSize(*b + 512) == 0);
  auto st = c.stats();
  CHECK(st.grants == 1);
  CHECK(st.granted_bytes == 4096);
  CHECK(st.blocks == 3);
  CHECK(st.used_bytes == 2048);
  CHECK(st.largest_free == 2048);

  // The rest of the chunk first; then a new chunk.
  auto e = c.Allocate(2048);
  REQUIRE(e.ok());
  CHECK(*e == *d + 512);
  auto f = c.Allocate(1);
  REQUIRE(f.ok());
  CHECK(src.asked == std::vector<uint64_t>{4096, 4096});
  CHECK(*f == (1u << 20) + 4096);
  for (uint64_t p : {*a, *b, *d, *e, *f}) CHECK(p % 512 == 0);
}

TEST_CASE("carver: freed blocks are reused first fit, and neighbours merge", "[carver]") {
  FakeSource src;
  Carver c(src.Fn(), 8192, 512);
  std::vector<uint64_t> p;
  for (int i = 0; i < 8; ++i) {
    auto r = c.Allocate(1024);
    REQUIRE(r.ok());
    p.push_back(*r);
  }
  CHECK(c.stats().largest_free == 0);
  // Free 1, 2 and 3 (in an order that merges left, then right, then both).
  REQUIRE(c.Free(p[1]).ok());
  REQUIRE(c.Free(p[3]).ok());
  CHECK(c.stats().free_ranges == 2);
  REQUIRE(c.Free(p[2]).ok());
  CHECK(c.stats().free_ranges == 1);
  CHECK(c.stats().largest_free == 3072);
  // A temporary freed by a loader is where the next fitting block goes.
  auto big = c.Allocate(3000);
  REQUIRE(big.ok());
  CHECK(*big == p[1]);
  CHECK(src.asked.size() == 1);  // no new grant
  // First fit: the lowest range that fits, not the best one.
  REQUIRE(c.Free(p[5]).ok());
  REQUIRE(c.Free(p[0]).ok());
  auto small = c.Allocate(512);
  REQUIRE(small.ok());
  CHECK(*small == p[0]);
  // Everything freed: one range, the whole grant.
  for (uint64_t q : {*small, *big, p[4], p[6], p[7]}) REQUIRE(c.Free(q).ok());
  auto st = c.stats();
  CHECK(st.blocks == 0);
  CHECK(st.used_bytes == 0);
  CHECK(st.free_ranges == 1);
  CHECK(st.largest_free == 8192);
}

TEST_CASE("carver: ranges of two grants never merge, even when the grants touch", "[carver]") {
  FakeSource src;  // back to back: grant 1 starts where grant 0 ends
  Carver c(src.Fn(), 4096, 512);
  auto a = c.Allocate(4096);
  auto b = c.Allocate(4096);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*b == *a + 4096);
  REQUIRE(c.Free(*a).ok());
  REQUIRE(c.Free(*b).ok());
  auto st = c.stats();
  CHECK(st.free_ranges == 2);
  CHECK(st.largest_free == 4096);
  // 8 KiB fits neither grant alone: a third grant, not a block across two.
  auto big = c.Allocate(8192);
  REQUIRE(big.ok());
  CHECK(*big == *b + 4096);
  CHECK(src.asked == std::vector<uint64_t>{4096, 4096, 8192});
}

TEST_CASE("carver: a block larger than the chunk gets a grant of its size - the chunk size can change",
          "[carver]") {
  FakeSource src;
  src.round = 2 << 20;  // a cuda holder rounds to its granularity
  src.gap = 1 << 20;
  Carver c(src.Fn(), 1 << 20, 512);
  auto big = c.Allocate(5 << 20);
  REQUIRE(big.ok());
  CHECK(src.asked.back() == (5u << 20));
  // The rounding is usable: a small block fits in the same grant.
  auto tail = c.Allocate(1 << 20);
  REQUIRE(tail.ok());
  CHECK(*tail == *big + (5u << 20));
  CHECK(src.asked.size() == 1);
  c.set_chunk_bytes(64 << 20);
  auto next = c.Allocate(4096);
  REQUIRE(next.ok());
  CHECK(src.asked.back() == (64u << 20));
  CHECK(c.Owns(*next + 4095));
  CHECK_FALSE(c.Owns(*big - 1));
  CHECK(c.stats().grants == 2);
}

TEST_CASE("carver: bad frees, bad sizes, refused and bad grants are errors that change nothing", "[carver]") {
  FakeSource src;
  src.fail_after = 1;
  Carver c(src.Fn(), 4096, 512);
  auto a = c.Allocate(100);
  REQUIRE(a.ok());

  Status twice_ok = c.Free(*a);
  REQUIRE(twice_ok.ok());
  Status twice = c.Free(*a);
  REQUIRE_FALSE(twice.ok());
  CHECK(twice.code() == Code::kInvalidArgument);
  CHECK_THAT(twice.error().message(), Catch::Contains("freed twice"));
  Status stranger = c.Free(12345);
  REQUIRE_FALSE(stranger.ok());
  CHECK_THAT(stranger.error().message(), Catch::Contains("not allocated here"));
  CHECK(c.stats().free_ranges == 1);

  auto zero = c.Allocate(0);
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.error().code() == Code::kInvalidArgument);
  auto huge = c.Allocate(Carver::kMaxBlockBytes + 1);
  REQUIRE_FALSE(huge.ok());

  // The source refuses the second grant: the error says what was asked and why.
  auto fill = c.Allocate(4096);
  REQUIRE(fill.ok());
  auto refused = c.Allocate(1);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code() == Code::kUnavailable);
  CHECK_THAT(refused.error().message(), Catch::Contains("out of memory (fake)"));
  CHECK_THAT(refused.error().message(), Catch::Contains("a new grant of 4096 bytes"));
  CHECK(c.stats().grants == 1);

  // A closed source: no block at all, not even from free ranges (the
  // memory is a committed layout's); frees are still taken.
  c.CloseSource("the layout was committed");
  CHECK_FALSE(c.source_open());
  auto none = c.Allocate(512);
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.error().message(), Catch::Contains("the layout was committed"));
  REQUIRE(c.Free(*fill).ok());
  CHECK(c.stats().blocks == 0);

  // A source that answers with a misaligned or overlapping grant is a bug, caught.
  Carver bad(
      [](uint64_t bytes) -> Result<Carver::Grant> {
        return Carver::Grant{0, 1000, bytes};
      },
      4096, 512);
  auto mis = bad.Allocate(10);
  REQUIRE_FALSE(mis.ok());
  CHECK(mis.error().code() == Code::kInternal);
  Carver same(
      [](uint64_t bytes) -> Result<Carver::Grant> {
        return Carver::Grant{0, 1 << 20, bytes};  // the same range every time
      },
      4096, 512);
  REQUIRE(same.Allocate(4096).ok());
  auto overlap = same.Allocate(4096);
  REQUIRE_FALSE(overlap.ok());
  CHECK_THAT(overlap.error().message(), Catch::Contains("overlaps an earlier one"));
  CHECK(same.stats().grants == 1);
}

TEST_CASE("carver: a loader's pattern of many allocations and frees stays inside the peak", "[carver]") {
  // Deterministic: tensors of varied sizes, each load frees a temporary of
  // the same size right after the tensor it produced.
  FakeSource src;
  Carver c(src.Fn(), 1 << 20, 512);
  std::set<uint64_t> live;
  uint64_t in_use = 0;
  for (int i = 0; i < 200; ++i) {
    const uint64_t size = 512u * static_cast<uint64_t>(1 + (i * 37) % 64);
    auto tmp = c.Allocate(size);
    auto t = c.Allocate(size);
    REQUIRE(tmp.ok());
    REQUIRE(t.ok());
    in_use += 2 * size;
    REQUIRE(c.Free(*tmp).ok());
    in_use -= size;
    CHECK(live.insert(*t).second);
  }
  auto st = c.stats();
  CHECK(st.blocks == 200);
  CHECK(st.used_bytes == in_use);
  // Every temporary was reused: the grants hold the tensors plus at most
  // one chunk of slack.
  CHECK(st.granted_bytes <= in_use + (1u << 20) + 64 * 512);
  for (uint64_t p : live) REQUIRE(c.Free(p).ok());
  CHECK(c.stats().free_ranges == st.grants);
}

// A carver of 4096-byte chunks and 512-byte blocks over a fake source.
struct SmallChunks {
  FakeSource src;
  Carver c{src.Fn(), 4096, 512};
};

TEST_CASE_METHOD(SmallChunks, "carver: a reservation is one grant asked for ahead, and blocks come from it",
                 "[carver]") {
  REQUIRE(c.Reserve(10000).ok());  // more than the chunk: its own size, aligned
  CHECK(src.asked == std::vector<uint64_t>{10240});
  CHECK(c.stats().grants == 1);
  CHECK(c.stats().blocks == 0);
  auto a = c.Allocate(4096);
  auto b = c.Allocate(6000);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(src.asked.size() == 1);  // both from the reservation
  CHECK(*a == (1u << 20));
  CHECK(*b == *a + 4096);
  // A small reservation asks for a whole chunk.
  REQUIRE(c.Reserve(1).ok());
  CHECK(src.asked == std::vector<uint64_t>{10240, 4096});
}

TEST_CASE_METHOD(SmallChunks, "carver: bad, closed and refused reservations are errors that change nothing",
                 "[carver]") {
  src.fail_after = 0;
  auto zero = c.Reserve(0);
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.error().message().find("ask for 1 byte to 1 TiB") != std::string::npos);
  CHECK(src.asked.empty());
  auto refused = c.Reserve(100);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code() == Code::kUnavailable);
  CHECK(refused.error().message().find("out of memory (fake)") != std::string::npos);
  CHECK(c.stats().grants == 0);
  c.CloseSource("the layout was committed");
  auto closed = c.Reserve(100);
  REQUIRE_FALSE(closed.ok());
  CHECK(closed.error().message().find("the layout was committed") != std::string::npos);
  CHECK(src.asked.size() == 1);
}

}  // namespace
}  // namespace wsup
