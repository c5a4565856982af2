// The KV pool's holder message (wire/kv_pool.h) and the record a restarted
// holder adopts (wire/kv_pool_record.h): a good pool round-trips; a
// malformed `kv_pool` reply (bad id, backend, device, allocations, sizes)
// is refused naming the field, never trusted; `info` carries the pool or
// nothing; a record is refused whole and still names its fds for closing.
#include "tests/text_check.h"
#include "tests/wire/wire_check.h"
#include "wire/kv_pool.h"

#include <catch2/catch.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/fs.h"
#include "testkit/test_util.h"
#include "wire/kv_pool_record.h"
#include "wire/protocol.h"

namespace wsup {
namespace {

using nlohmann::json;

using test::Has;

KvPoolMsg Pool() {
  KvPoolMsg m;
  m.id = "0123456789abcdef0123456789abcdef";
  m.allocations = {4u << 20, 2u << 20};
  return m;
}

// Applies `damage` to a good reply and expects DecodeKvPool to refuse it
// naming `says`.
void Refuses(const std::function<void(json&)>& damage, const std::string& says) {
  json j = EncodeKvPool(Pool());
  damage(j);
  auto r = DecodeKvPool(json::parse(j.dump()));
  test::CheckCorrupt(r, {"kv_pool", says});
}

TEST_CASE("a kv_pool reply round-trips, and a new id is 32 lower-case hex digits", "[wire][kv]") {
  auto back = DecodeKvPool(EncodeKvPool(Pool()));
  REQUIRE(back.ok());
  CHECK(back->id == Pool().id);
  CHECK(back->backend == "host");
  CHECK(back->device == -1);
  CHECK(back->allocations == Pool().allocations);
  CHECK(back->bytes() == (6u << 20));
  CHECK(EncodeKvPoolRequest()["type"] == "kv_pool");

  std::string a = MakeKvPoolId(), b = MakeKvPoolId();
  CHECK(a.size() == 32);
  CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(a != b);

  KvPoolMsg cuda = Pool();
  cuda.backend = "cuda";
  cuda.device = 3;
  cuda.device_uuid = "GPU-0000";
  auto c = DecodeKvPool(EncodeKvPool(cuda));
  REQUIRE(c.ok());
  CHECK(c->device == 3);
  CHECK(c->device_uuid == "GPU-0000");
}

TEST_CASE("a malformed kv_pool reply is refused naming the field", "[wire][kv]") {
  SECTION("bad id") {
    Refuses([](json& j) { j["id"] = "xyz"; }, "'id'");
    Refuses([](json& j) { j["id"] = "0123456789ABCDEF0123456789ABCDEF"; }, "'id'");
    Refuses([](json& j) { j["id"] = "0123456789abcdef0123456789abcde"; }, "'id'");
    Refuses([](json& j) { j["id"] = 7; }, "'id'");
    Refuses([](json& j) { j.erase("id"); }, "'id'");
  }
  SECTION("bad backend") {
    Refuses([](json& j) { j["backend"] = "rocm"; }, "'backend'");
    Refuses([](json& j) { j["backend"] = 1; }, "'backend'");
  }
  SECTION("device and backend that do not go together") {
    Refuses([](json& j) { j["device"] = 0; }, "does not go with backend host");
    Refuses(
        [](json& j) {
          j["backend"] = "cuda";
          j["device"] = -1;
        },
        "does not go with backend cuda");
    Refuses([](json& j) { j["device"] = 5000; }, "out of range");
    Refuses([](json& j) { j["device_uuid"] = ""; }, "'device_uuid'");
    Refuses([](json& j) { j["device_uuid"] = "a\nb"; }, "'device_uuid'");
  }
  SECTION("no allocations, or too many") {
    Refuses([](json& j) { j["allocations"] = json::array(); }, "has 0 entries");
    Refuses([](json& j) { j.erase("allocations"); }, "'allocations'");
    Refuses([](json& j) { j["allocations"] = "4096"; }, "'allocations'");
    Refuses([](json& j) { j["allocations"] = std::vector<uint64_t>(kMaxKvPoolAllocations + 1, 4096); },
            "entries");
  }
  SECTION("a zero, negative or non-integer size") {
    Refuses([](json& j) { j["allocations"] = {4096, 0}; }, "an allocation size");
    Refuses([](json& j) { j["allocations"] = {-4096}; }, "an allocation size");
    Refuses([](json& j) { j["allocations"] = {1.5}; }, "an allocation size");
    Refuses([](json& j) { j["allocations"] = {kMaxKvPoolBytes + 1}; }, "an allocation size");
  }
  SECTION("sizes whose sum overflows the largest pool (or 64 bits)") {
    Refuses([](json& j) { j["allocations"] = {kMaxKvPoolBytes, 1}; }, "add up to more than");
    std::vector<uint64_t> many(4096, kMaxKvPoolBytes / 2);
    Refuses([&](json& j) { j["allocations"] = many; }, "add up to more than");
  }
}

TEST_CASE("info carries the KV pool when the holder has one, and nothing from older holders", "[wire][kv]") {
  InfoMsg m;
  m.backend = "host";
  json plain = EncodeInfo(m);
  CHECK_FALSE(plain.contains("kv_pool"));
  auto none = DecodeInfo(plain);
  REQUIRE(none.ok());
  CHECK_FALSE(none->kv_pool.has_value());

  m.kv_pool = KvPoolInfo{Pool().id, 6u << 20, 2, true};
  auto back = DecodeInfo(json::parse(EncodeInfo(m).dump()));
  REQUIRE(back.ok());
  REQUIRE(back->kv_pool.has_value());
  CHECK(back->kv_pool->id == Pool().id);
  CHECK(back->kv_pool->bytes == (6u << 20));
  CHECK(back->kv_pool->allocations == 2);
  CHECK(back->kv_pool->adopted);

  json bad = EncodeInfo(m);
  bad["kv_pool"]["bytes"] = -1;
  CHECK_FALSE(DecodeInfo(bad).ok());
  bad = EncodeInfo(m);
  bad["kv_pool"] = "pool";
  CHECK_FALSE(DecodeInfo(bad).ok());
}

TEST_CASE("a KV pool record round-trips through its file and refuses a record that is not whole",
          "[wire][kv]") {
  test::TempDir dir;
  KvPoolRecord in{Pool(), {5, 6}};
  std::string path = dir.Join("holder-0.kvpool.json");
  REQUIRE(WriteKvPoolRecord(path, in).ok());
  auto back = ReadKvPoolRecord(path);
  REQUIRE(back.ok());
  CHECK(back->pool.id == in.pool.id);
  CHECK(back->pool.allocations == in.pool.allocations);
  CHECK(back->fds == in.fds);
  CHECK(ReadKvPoolRecordNamedFds(path) == std::vector<int>{5, 6});

  auto refuses = [&](const std::function<void(json&)>& damage, const std::string& says) {
    json j = KvPoolRecordToJson(in);
    damage(j);
    auto r = KvPoolRecordFromJson(json::parse(j.dump()));
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message());
    CHECK(Has(r.error().message(), says));
  };
  refuses([](json& j) { j["format"] = "wsup-layouts-record"; }, "not a wsup KV pool record");
  refuses([](json& j) { j["version"] = 2; }, "version 2");
  refuses([](json& j) { j.erase("pool"); }, "no 'pool'");
  refuses([](json& j) { j["pool"]["id"] = "nope"; }, "'id'");
  refuses([](json& j) { j["fds"] = {5}; }, "names 1 fds for 2 allocations");
  refuses([](json& j) { j["fds"] = {5, 5}; }, "fd 5 twice");
  refuses([](json& j) { j["fds"] = {2, 5}; }, "not an inherited fd number");
  refuses([](json& j) { j.erase("fds"); }, "no 'fds'");

  // A refused record still names its fds, so the holder can close them.
  json wrong = KvPoolRecordToJson(in);
  wrong["fds"] = {5, 6, 7, 1, "x"};
  CHECK(KvPoolRecordNamedFds(wrong) == std::vector<int>{5, 6, 7});
  CHECK(KvPoolRecordNamedFds(json("garbage")).empty());
  REQUIRE(WriteFileAtomic(path, "{not json", 0600).ok());
  CHECK_FALSE(ReadKvPoolRecord(path).ok());
  CHECK(ReadKvPoolRecordNamedFds(path).empty());
  auto missing = ReadKvPoolRecord(dir.Join("none.json"));
  REQUIRE_FALSE(missing.ok());
  CHECK(Has(missing.error().message(), "none.json"));
}

}  // namespace
}  // namespace wsup
