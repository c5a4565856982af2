// The KV cache's free blocks (engine/block_allocator.h): the pool's first
// and only while they are handed out, the lowest ids first, every block
// back to its kind, exhaustion said in words, a dead engine's pages
// adopted or released.
#include <catch2/catch.hpp>

#include <vector>

#include "engine/block_allocator.h"

using namespace wsup;
using namespace wsup::engine;

namespace {

// pool_blocks of the pool (ids 0..), then the scratch's, one id apart (the
// block that straddles the pool's end is nobody's).
KvLayout Layout(int pool_blocks, int scratch_blocks) {
  KvLayout kv;
  kv.block_size = 16;
  kv.block_bytes = 4096;
  kv.pool_blocks = pool_blocks;
  kv.scratch_first = pool_blocks == 0 ? 0 : pool_blocks + 1;
  kv.scratch_blocks = scratch_blocks;
  return kv;
}

}  // namespace

TEST_CASE("block allocator: a private cache hands out its lowest free blocks, and takes them back") {
  BlockAllocator a(Layout(0, 4));
  CHECK(a.free_count() == 4);
  std::vector<int32_t> b;
  REQUIRE(a.Take(3, &b).ok());
  CHECK(b == std::vector<int32_t>{2, 1, 0});
  CHECK(a.free_count() == 1);
  CHECK(a.pool_in_use() == 0);
  a.Free(&b);
  CHECK(b.empty());
  CHECK(a.free_count() == 4);
  // Freed blocks are used again, before the ones never used.
  std::vector<int32_t> again;
  REQUIRE(a.Take(3, &again).ok());
  CHECK(again == std::vector<int32_t>{2, 1, 0});
}

TEST_CASE("block allocator: exhaustion takes nothing and says how many are free and needed") {
  BlockAllocator a(Layout(0, 3));
  std::vector<int32_t> held;
  REQUIRE(a.Take(2, &held).ok());
  std::vector<int32_t> more = {7};  // appended to, never replaced
  Status st = a.Take(2, &more);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == Code::kUnavailable);
  CHECK(st.error().message().find("1 free blocks") != std::string::npos);
  CHECK(st.error().message().find("needs 2") != std::string::npos);
  CHECK(more == std::vector<int32_t>{7});
  CHECK(a.free_count() == 1);
  REQUIRE(a.Take(1, &more).ok());
  CHECK(more == std::vector<int32_t>{7, 2});
  CHECK(a.Take(0, &more).ok());
  CHECK_FALSE(a.Take(1, &more).ok());
}

TEST_CASE("block allocator: the pool's blocks go first once open, never the kept ones") {
  BlockAllocator a(Layout(4, 2));
  CHECK(a.free_count() == 2);  // the pool's are not handed out before it opens
  CHECK_FALSE(a.pool_open());
  a.OpenPool({true, false, true, false});
  CHECK(a.pool_open());
  CHECK(a.free_count() == 4);
  std::vector<int32_t> b;
  REQUIRE(a.Take(3, &b).ok());
  CHECK(b == std::vector<int32_t>{3, 1, 5});  // both free pool blocks, then the scratch's first
  CHECK(a.is_pool(1));
  CHECK_FALSE(a.is_pool(5));
  CHECK(a.pool_in_use() == 2);
  a.Free(&b);
  CHECK(a.pool_in_use() == 0);
  CHECK(a.free_count() == 4);
}

TEST_CASE("block allocator: a closed pool's blocks are dropped as they come back, and listed again on open") {
  BlockAllocator a(Layout(3, 1));
  a.OpenPool({});
  std::vector<int32_t> b;
  REQUIRE(a.Take(2, &b).ok());
  CHECK(b == std::vector<int32_t>{1, 0});
  a.ClosePool();
  CHECK_FALSE(a.pool_open());
  CHECK(a.free_count() == 1);  // the scratch only
  a.Release(2);                // not handed out: dropped
  CHECK(a.free_count() == 1);
  a.Free(&b);
  CHECK(a.pool_in_use() == 0);
  CHECK(a.free_count() == 1);
  a.OpenPool({false, false, false});
  CHECK(a.free_count() == 4);
}

TEST_CASE("block allocator: a dead engine's kept pages are adopted by a sequence or released for anyone") {
  BlockAllocator a(Layout(6, 2));
  // The journal is block 0; pages 2, 3 and 5 are kept for resumes.
  a.OpenPool({true, false, true, true, false, true});
  CHECK(a.free_count() == 4);
  std::vector<int32_t> seq;
  a.Adopt({3, 2}, &seq);  // in the sequence's order, not the ids'
  CHECK(seq == std::vector<int32_t>{3, 2});
  CHECK(a.pool_in_use() == 2);
  CHECK(a.free_count() == 4);
  // Its further blocks are taken after what it adopted.
  REQUIRE(a.Take(1, &seq).ok());
  CHECK(seq == std::vector<int32_t>{3, 2, 1});
  // Nobody resumed the other: free again.
  a.Release(5);
  CHECK(a.free_count() == 4);
  std::vector<int32_t> other;
  REQUIRE(a.Take(2, &other).ok());
  CHECK(other == std::vector<int32_t>{4, 5});
  a.Free(&seq);
  a.Free(&other);
  CHECK(a.pool_in_use() == 0);
  CHECK(a.free_count() == 7);  // every block but the journal's
}
