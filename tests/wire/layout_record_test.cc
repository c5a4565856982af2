// The kept layouts' records (wire/layout_record.h) and the keeper's messages
// (wire/layout_protocol.h): a record round-trips through its JSON, a
// layouts record file and the `kept` message; bad records are refused
// naming the layout and the field, and in a file one bad layout never
// costs the others.
#include <catch2/catch.hpp>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/fs.h"
#include "testkit/test_util.h"
#include "tests/text_check.h"
#include "tests/wire/wire_check.h"
#include "wire/layout_protocol.h"
#include "wire/layout_record.h"

namespace wsup {
namespace {

using nlohmann::json;

using test::Has;

LayoutRecord Record(uint64_t id, std::vector<int> fds = {3, 4}) {
  LayoutRecord r;
  r.id = id;
  r.fingerprint.Set("checkpoint", "abc");
  AddEngineLayout(&r.fingerprint, EngineLayoutId{"wsup-engine", "0.1.0", "fuse_gate_up/v1"});
  r.manifest.backend = "host";
  r.manifest.device = -1;
  r.manifest.device_uuid = "host";
  r.manifest.allocations = {{4096}, {8192}};
  r.manifest.entries = {{"a", "F32", {4, 4}, 0, 0, 64}, {"b", "F32", {8}, 1, 256, 32}};
  r.layout_hash = LayoutHash(r.manifest.entries);
  r.fds = std::move(fds);
  return r;
}

// Applies `damage` to a good record's JSON and expects LayoutRecordFromJson
// to refuse it, naming `says`.
void Refuses(bool with_fds, const std::function<void(json&)>& damage, const std::string& says) {
  json j = LayoutRecordToJson(Record(7), with_fds);
  damage(j);
  auto r = LayoutRecordFromJson(json::parse(j.dump()), with_fds, "test record");
  test::CheckCorrupt(r, {"test record", says});
}

TEST_CASE("a layout record round-trips, with its fds in a file and without them in 'kept'", "[wire][layout]") {
  LayoutRecord in = Record(7);
  auto back = LayoutRecordFromJson(json::parse(LayoutRecordToJson(in, true).dump()), true, "x");
  REQUIRE(back.ok());
  CHECK(back->id == 7);
  CHECK(back->layout_hash == in.layout_hash);
  CHECK(back->fingerprint.Compare(in.fingerprint).empty());
  CHECK(back->manifest.entries.size() == 2);
  CHECK(back->manifest.allocations.size() == 2);
  CHECK(back->fds == std::vector<int>{3, 4});

  auto kept = DecodeKept(json::parse(EncodeKept(in).dump()));
  REQUIRE(kept.ok());
  CHECK(kept->id == 7);
  CHECK(kept->fds.empty());  // the fds come with the message, not in it
  CHECK(EncodeKept(in)["record"].count("fds") == 0);

  CommittedMsg c;
  c.layouts = {{7, in.layout_hash, 2}, {9, in.layout_hash, 1}};
  auto cm = DecodeCommitted(json::parse(EncodeCommitted(c).dump()));
  REQUIRE(cm.ok());
  REQUIRE(cm->layouts.size() == 2);
  CHECK(cm->layouts[1].id == 9);
  CHECK(cm->layouts[0].allocations == 2);
  auto k = DecodeKeep(EncodeKeep(KeepMsg{9}));
  REQUIRE(k.ok());
  CHECK(k->layout == 9);
}

TEST_CASE("a bad layout record is refused naming the layout and the field", "[wire][layout]") {
  Refuses(true, [](json& j) { j["id"] = 0; }, "field 'id'");
  Refuses(true, [](json& j) { j.erase("id"); }, "field 'id'");
  Refuses(true, [](json& j) { j["layout_hash"] = "ABC"; }, "64 lower-case hex");
  Refuses(true, [](json& j) { j["layout_hash"] = std::string(64, '0'); }, "is not the hash of its entries");
  Refuses(true, [](json& j) { j["fingerprint"]["layout"] = "checkpoint"; }, "names no engine-made layout");
  Refuses(true, [](json& j) { j["fingerprint"] = 5; }, "field 'fingerprint'");
  Refuses(true, [](json& j) { j.erase("manifest"); }, "field 'manifest'");
  // An entry past its allocation's end: the manifest's own checks.
  Refuses(true, [](json& j) { j["manifest"]["entries"][0][4] = 4096; }, "layout 7");
  Refuses(true, [](json& j) { j["fds"] = {3}; }, "names 1 fds for 2 allocations");
  Refuses(true, [](json& j) { j["fds"] = {3, 2}; }, "not an inherited fd number");
  Refuses(true, [](json& j) { j["fds"] = {3, "4"}; }, "not an inherited fd number");
  Refuses(true, [](json& j) { j.erase("fds"); }, "field 'fds'");
  Refuses(false, [](json& j) { j = json::array(); }, "not an object");
  // An entry's hash over other entries: the hash still decides.
  Refuses(false, [](json& j) { j["manifest"]["entries"].erase(1); }, "is not the hash of its entries");

  // The keeper's messages.
  auto committed = [](const json& j) { return DecodeCommitted(j); };
  CommittedMsg c;
  c.layouts = {{7, std::string(64, 'a'), 2}};
  json good = EncodeCommitted(c);
  for (auto [damage, says] : std::vector<std::pair<std::function<void(json&)>, std::string>>{
           {[](json& j) { j["layouts"] = 1; }, "field 'layouts'"},
           {[](json& j) { j["layouts"][0]["id"] = 0; }, "id 0"},
           {[](json& j) { j["layouts"][0]["allocations"] = 5000; }, "5000 allocations"},
           {[](json& j) { j["layouts"][0]["allocations"] = 0; }, "0 allocations"},
           {[](json& j) { j["layouts"][0].erase("layout_hash"); }, "field 'layout_hash'"},
       }) {
    json j = good;
    damage(j);
    auto r = committed(json::parse(j.dump()));
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message());
    CHECK(Has(r.error().message(), says));
  }
  CHECK_FALSE(DecodeKeep(json{{"type", "keep"}, {"layout", 0}}).ok());
  CHECK_FALSE(DecodeKeep(json{{"type", "keep"}}).ok());
  CHECK_FALSE(DecodeKept(json{{"type", "kept"}}).ok());
  json kept = EncodeKept(Record(3));
  kept["record"]["layout_hash"] = std::string(64, 'f');
  auto bad_kept = DecodeKept(kept);
  REQUIRE_FALSE(bad_kept.ok());
  CHECK(Has(bad_kept.error().message(), "'kept' message: record (layout 3)"));
}

TEST_CASE("a layouts record file: one bad layout is refused with its fds, the others are read", "[wire][layout]") {
  test::TempDir dir;
  const std::string path = dir.Join("holder-0.layouts.json");
  REQUIRE(WriteLayoutsRecord(path, {Record(1, {3, 4}), Record(2, {5, 6})}).ok());
  auto read = ReadLayoutsRecord(path);
  REQUIRE(read.ok());
  REQUIRE(read->layouts.size() == 2);
  CHECK(read->refused.empty());
  CHECK(read->layouts[1].id == 2);
  CHECK(read->layouts[1].fds == std::vector<int>{5, 6});

  // Layout 2 damaged, layout 3 naming an fd of layout 1: both refused, each
  // with the fds only it named; layout 1 is read.
  json j = LayoutsRecordToJson({Record(1, {3, 4}), Record(2, {5, 6}), Record(3, {4, 7})});
  j["layouts"][1]["layout_hash"] = std::string(64, '0');
  auto mixed = LayoutsRecordFromJson(json::parse(j.dump()));
  REQUIRE(mixed.ok());
  REQUIRE(mixed->layouts.size() == 1);
  CHECK(mixed->layouts[0].id == 1);
  REQUIRE(mixed->refused.size() == 2);
  CHECK(mixed->refused[0].id == 2);
  CHECK(mixed->refused[0].fds == std::vector<int>{5, 6});
  CHECK(Has(mixed->refused[0].error.message(), "layouts[1] (layout 2)"));
  CHECK(mixed->refused[1].id == 3);
  CHECK(mixed->refused[1].fds == std::vector<int>{7});
  CHECK(Has(mixed->refused[1].error.message(), "fd 4 is named twice"));
  // One layout naming one fd for both its allocations.
  auto twice = LayoutsRecordFromJson(LayoutsRecordToJson({Record(4, {9, 9})}));
  REQUIRE(twice.ok());
  CHECK(twice->layouts.empty());
  REQUIRE(twice->refused.size() == 1);
  CHECK(twice->refused[0].fds == std::vector<int>{9});

  // The file as a whole: refused only when it is not a layouts record.
  auto as_whole = [&](const std::string& text, const std::string& says) {
    REQUIRE(WriteFileAtomic(path, text, 0600).ok());
    auto r = ReadLayoutsRecord(path);
    REQUIRE_FALSE(r.ok());
    INFO(r.error().message());
    CHECK(Has(r.error().message(), path));
    CHECK(Has(r.error().message(), says));
  };
  as_whole("{\"format\": \"wsup-arena-record\"}", "not a wsup layouts record");
  as_whole("{\"format\": \"wsup-layouts-record\", \"version\": 2, \"layouts\": []}", "version 2");
  as_whole("{\"format\": \"wsup-layouts-record\", \"version\": 1}", "'layouts' array");
  as_whole("[1, 2", "");
  auto missing = ReadLayoutsRecord(dir.Join("none.json"));
  REQUIRE_FALSE(missing.ok());
  // An empty list is a record with nothing to adopt.
  auto empty = LayoutsRecordFromJson(LayoutsRecordToJson({}));
  REQUIRE(empty.ok());
  CHECK(empty->layouts.empty());
  CHECK(empty->refused.empty());
}

}  // namespace
}  // namespace wsup
