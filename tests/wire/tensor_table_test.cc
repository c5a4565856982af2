// The binary tensor table (wire/manifest.h): round trips, every kind of
// damage refused with a message that names it, random bytes never read past
// the end; the name index in both of its modes; Validate() on entries out of
// layout order.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/text_check.h"
#include "tests/wire/wire_check.h"
#include "wire/manifest.h"

namespace wsup {
namespace {

using nlohmann::json;

using test::Has;

// Entries of every shape the table must carry: several dtypes, a scalar,
// an empty tensor, the largest rank, a long name.
Manifest Varied() {
  Manifest m = test::HostManifest({{16384}, {4096}});
  m.entries = {
      {"model.embed_tokens.weight", "BF16", {16, 32}, 0, 0, 1024},
      {"model.norm.weight", "F32", {32}, 0, 1024, 128},
      {"scale", "F32", {}, 0, 1280, 4},
      {"empty", "F16", {0, 7}, 0, 1536, 0},
      {"deep", "I8", {1, 1, 1, 1, 1, 1, 2, 3}, 0, 1536, 6},
      {std::string(1024, 'n'), "F8_E4M3", {100}, 1, 0, 100},
      {"model.layers.0.mlp.experts.0.gate_proj.weight", "BF16", {2, 8}, 1, 256, 32},
  };
  return m;
}

void CheckSameEntries(const std::vector<ManifestEntry>& a, const std::vector<ManifestEntry>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("entry " << i);
    CHECK(a[i].name == b[i].name);
    CHECK(a[i].dtype == b[i].dtype);
    CHECK(a[i].shape == b[i].shape);
    CHECK(a[i].alloc == b[i].alloc);
    CHECK(a[i].offset == b[i].offset);
    CHECK(a[i].nbytes == b[i].nbytes);
    CHECK(a[i].strides == b[i].strides);
  }
}

void Put32(std::string& t, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) t[at + static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void Put64(std::string& t, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) t[at + static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}

TEST_CASE("tensor tables round-trip every field, beside a header that announces them", "[client][manifest]") {
  const Manifest m = Varied();
  REQUIRE(m.Validate().ok());
  auto table = EncodeTensorTable(m.entries);
  REQUIRE(table.ok());
  // 64-byte header, 32 bytes per record, 8 per dim, then the names and each
  // dtype spelling once.
  size_t dims = 0, names = 0;
  for (const auto& e : m.entries) {
    dims += e.shape.size();
    names += e.name.size();
  }
  const size_t dtypes = std::string("BF16F32F16I8F8_E4M3").size();
  CHECK(table->size() == 64 + 32 * m.entries.size() + 8 * dims + names + dtypes);
  CHECK(table->substr(0, 8) == "wsupTTBL");

  std::vector<ManifestEntry> back;
  REQUIRE(DecodeTensorTable(*table, &back).ok());
  CheckSameEntries(back, m.entries);

  json header = ManifestHeaderToJson(m, table->size());
  CHECK_FALSE(header.contains("entries"));
  CHECK(header["tensor_table"]["entries"] == m.entries.size());
  auto parsed = ManifestFromJson(json::parse(header.dump()), *table);
  REQUIRE(parsed.ok());
  CHECK(ManifestToJson(*parsed) == ManifestToJson(m));

  // No entries at all is a table too.
  auto none = EncodeTensorTable({});
  REQUIRE(none.ok());
  CHECK(none->size() == 64);
  REQUIRE(DecodeTensorTable(*none, &back).ok());
  CHECK(back.empty());
}

TEST_CASE("a cut, padded or garbled tensor table is refused, naming what is wrong", "[client][manifest]") {
  const Manifest m = Varied();
  const std::string good = EncodeTensorTable(m.entries).value();
  std::vector<ManifestEntry> out;

  SECTION("every truncation") {
    for (size_t n = 0; n < good.size(); ++n) {
      INFO("first " << n << " bytes");
      // A copy of exactly n bytes, so that ASan sees any read past them.
      std::vector<char> cut(good.begin(), good.begin() + static_cast<long>(n));
      Status st = DecodeTensorTable(std::string_view(cut.data(), cut.size()), &out);
      REQUIRE_FALSE(st.ok());
      CHECK(st.code() == Code::kCorrupt);
      CHECK(Has(st.error().message(), "tensor table: "));
      CHECK(Has(st.error().message(), n < 64 ? "shorter than its 64-byte header" : "cut short"));
      CHECK(out.empty());
    }
  }
  SECTION("damage, one field at a time") {
    const size_t rec0 = 64;           // the first record
    const size_t rec5 = 64 + 5 * 32;  // the long name's record
    struct Case {
      const char* what;
      std::function<void(std::string&)> damage;
      const char* says;
    };
    const std::vector<Case> cases = {
        {"trailing byte", [](std::string& t) { t.push_back('x'); }, "trailing bytes"},
        {"magic", [](std::string& t) { t[0] = 'W'; }, "not a wsup tensor table"},
        {"version", [](std::string& t) { Put32(t, 8, 2); }, "version 2, but this wsup reads version 1"},
        {"header size", [](std::string& t) { Put32(t, 12, 72); }, "header of 72 bytes"},
        {"record size", [](std::string& t) { Put32(t, 16, 40); }, "records of 40 bytes"},
        {"unknown flag", [](std::string& t) { Put32(t, 20, 2); }, "flags or reserved header fields are set (flags 2)"},
        {"strides flag on a table without strides", [](std::string& t) { Put32(t, 20, 1); },
         "shape and strides run past"},
        {"reserved", [](std::string& t) { Put64(t, 56, 1); }, "flags or reserved"},
        {"absurd entry count", [](std::string& t) { Put64(t, 24, 1ull << 40); }, "more than the 4000000"},
        {"entry count off by one", [](std::string& t) { Put64(t, 24, 6); }, "do not add up"},
        {"dims count", [](std::string& t) { Put64(t, 32, 1ull << 60); }, "more than the table can hold"},
        {"string bytes", [](std::string& t) { Put64(t, 40, 1ull << 50); }, "more than the table can hold"},
        {"total bytes", [](std::string& t) { Put64(t, 48, 1ull << 33); }, "cut short"},
        {"name past the strings", [=](std::string& t) { Put32(t, rec5 + 20, 0xfffffff0u); },
         "record 5: its name (offset 4294967280"},
        {"dtype past the strings", [=](std::string& t) { Put32(t, rec0 + 28, 0x7fffffffu); },
         "record 0: its dtype"},
        {"rank over 8", [=](std::string& t) { t[rec0 + 27] = 9; }, "record 0: rank 9"},
        {"shape past the dims", [=](std::string& t) { t[rec5 + 27] = 8; }, "record 5: its shape runs past"},
        {"dims left over", [=](std::string& t) { t[rec0 + 27] = 1; },
         "its records use 15 dims but its header counts 16"},
    };
    for (const auto& c : cases) {
      INFO(c.what);
      std::string t = good;
      c.damage(t);
      Status st = DecodeTensorTable(t, &out);
      REQUIRE_FALSE(st.ok());
      INFO(st.error().message());
      CHECK(Has(st.error().message(), c.says));
      CHECK(Has(st.error().message(), "restart the holder"));
      CHECK(out.empty());
    }
  }
  SECTION("structurally fine, wrong in content: Validate() names the entry") {
    std::string t = good;
    Put64(t, 64 + 8, 1000);  // entry 0's nbytes
    auto r = ManifestFromJson(ManifestHeaderToJson(m, t.size()), t);
    REQUIRE_FALSE(r.ok());
    CHECK(Has(r.error().message(), "manifest entry 0 ('model.embed_tokens.weight'): field 'nbytes' = 1000"));
  }
  SECTION("random bytes and random damage never crash") {
    std::mt19937_64 rng(12345);
    for (int i = 0; i < 2000; ++i) {
      std::string t;
      if (i % 2 == 0) {
        t.resize(rng() % 600);
        for (char& ch : t) ch = static_cast<char>(rng());
        if (i % 4 == 0 && t.size() >= 64) std::memcpy(t.data(), good.data(), 64);  // a plausible header
      } else {
        t = good;
        for (int k = 0, flips = 1 + static_cast<int>(rng() % 8); k < flips; ++k) {
          t[rng() % t.size()] = static_cast<char>(rng());
        }
      }
      std::vector<char> exact(t.begin(), t.end());
      std::string_view view(exact.data(), exact.size());
      Status st = DecodeTensorTable(view, &out);
      if (!st.ok()) {
        CHECK(Has(st.error().message(), "tensor table: "));
        continue;
      }
      // Decoded: the manifest it makes is then validated or refused, cleanly.
      auto r = ManifestFromJson(ManifestHeaderToJson(m, view.size()), view);
      if (!r.ok()) CHECK(r.error().code() == Code::kCorrupt);
    }
  }
}

TEST_CASE("a manifest header and its table must agree", "[client][manifest]") {
  const Manifest m = Varied();
  const std::string table = EncodeTensorTable(m.entries).value();
  const json header = ManifestHeaderToJson(m, table.size());
  struct Case {
    const char* what;
    std::function<void(json&)> mutate;
    std::string table;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"no table came", [](json&) {}, "", "(no table came with it)"},
      {"a table nobody announced", [](json& j) { j = ManifestToJson(Varied()); }, table,
       "came with a manifest that announces none"},
      {"entries and a table", [](json& j) { j["entries"] = json::array(); }, table,
       "both 'entries' and 'tensor_table'"},
      {"other format", [](json& j) { j["tensor_table"]["format"] = "npz"; }, table, "format 'npz'"},
      {"newer version", [](json& j) { j["tensor_table"]["version"] = 2; }, table,
       "tensor table is version 2 but this wsup reads version 1"},
      {"bytes differ", [](json& j) { j["tensor_table"]["bytes"] = 10; }, table,
       "but the manifest announces 10"},
      {"count differs", [](json& j) { j["tensor_table"]["entries"] = 3; }, table,
       "holds 7 entries but the manifest announces 3"},
      {"table not an object", [](json& j) { j["tensor_table"] = 1; }, table,
       "field 'tensor_table' is not an object"},
      {"bytes missing", [](json& j) { j["tensor_table"].erase("bytes"); }, table,
       "manifest tensor_table: field 'bytes' is missing"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    json j = header;
    c.mutate(j);
    auto r = ManifestFromJson(j, c.table);
    test::CheckCorrupt(r, {c.says});
  }
  // And the good pair, for contrast.
  CHECK(ManifestFromJson(header, table).ok());
}

std::vector<ManifestEntry> Named(size_t n) {
  std::vector<ManifestEntry> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i].name = "model.layers." + std::to_string(i / 7) + ".t" + std::to_string(i % 7);
  return v;
}

TEST_CASE("the name index finds every name and refuses duplicates, hashed or sorted", "[client][manifest]") {
  const auto entries = Named(5000);
  for (uint64_t budget : {TensorIndex::kScaledBudget, uint64_t{0}, uint64_t{2000}}) {
    INFO("probe budget " << budget);
    TensorIndex index;
    size_t a = 0, b = 0;
    REQUIRE(index.Build(entries, &a, &b, budget));
    CHECK(index.sorted() == (budget != TensorIndex::kScaledBudget));
    for (size_t i = 0; i < entries.size(); ++i) REQUIRE(index.Find(entries[i].name, entries) == i);
    CHECK(index.Find("model.layers.0.t7", entries) == TensorIndex::npos);
    CHECK(index.Find("", entries) == TensorIndex::npos);
    CHECK(index.Find("zzz", entries) == TensorIndex::npos);

    auto dup = entries;
    dup[4321].name = dup[17].name;
    REQUIRE_FALSE(index.Build(dup, &a, &b, budget));
    CHECK(a == 17);
    CHECK(b == 4321);
    CHECK(index.Find(entries[0].name, entries) == TensorIndex::npos);  // emptied
  }
  TensorIndex empty;
  size_t a = 0, b = 0;
  REQUIRE(empty.Build({}, &a, &b));
  CHECK(empty.Find("x", {}) == TensorIndex::npos);

  Manifest m = Varied();
  m.entries[6].name = m.entries[1].name;
  Status st = m.Validate();
  REQUIRE_FALSE(st.ok());
  CHECK(Has(st.error().message(),
            "manifest entry 6 ('model.norm.weight'): field 'name' is a duplicate of entry 1"));
}

TEST_CASE("Validate finds overlaps in any entry order", "[client][manifest]") {
  Manifest m = Varied();
  std::reverse(m.entries.begin(), m.entries.end());
  REQUIRE(m.Validate().ok());  // out of layout order, still consistent
  SECTION("overlap found after sorting") {
    m.entries[0].offset = 0;  // the gate_proj (32 bytes at 256 of allocation 1) onto the long name's bytes
    Status st = m.Validate();
    REQUIRE_FALSE(st.ok());
    CHECK(Has(st.error().message(), "overlaps"));
    CHECK(Has(st.error().message(), "in allocation 1"));
  }
  SECTION("an entry inside an earlier one that is not its neighbour") {
    Manifest l = Varied();
    l.entries[2].offset = 512;  // scale, into the embedding (0 to 1024), past the norm
    Status st = l.Validate();
    REQUIRE_FALSE(st.ok());
    CHECK(Has(st.error().message(),
              "manifest entry 2 ('scale'): field 'offset' = 512 overlaps manifest entry 0 "
              "('model.embed_tokens.weight'), which ends at 1024"));
  }
}

}  // namespace
}  // namespace wsup

namespace wsup {
namespace {

// An engine-made layout: a transposed matrix (strides [1, 4] over a 4 x 3
// shape), a padded one (rows of 8 elements holding 5) and a contiguous one
// whose explicit strides are the contiguous ones.
Manifest Strided() {
  Manifest m = test::HostManifest({{4096}});
  ManifestEntry t{"transposed", "F32", {4, 3}, 0, 0, 48};
  t.strides = {1, 4};
  ManifestEntry p{"padded", "BF16", {3, 5}, 0, 256, (2 * 8 + 5) * 2};
  p.strides = {8, 1};
  ManifestEntry c{"contiguous", "F32", {2, 3}, 0, 512, 24};
  m.entries = {t, p, c};
  return m;
}

TEST_CASE("strides round-trip through JSON and the tensor table, contiguous ones in one spelling",
          "[client][manifest]") {
  Manifest m = Strided();
  REQUIRE(m.Validate().ok());
  CHECK(ContiguousStrides({4, 3}) == std::vector<int64_t>{3, 1});
  CHECK(ContiguousStrides({2, 0, 5}) == std::vector<int64_t>{5, 5, 1});
  CHECK(ContiguousStrides({}).empty());

  json j = ManifestToJson(m);
  CHECK(j["entry_fields"].size() == 7);
  auto back = ManifestFromJson(j);
  REQUIRE(back.ok());
  CheckSameEntries(back->entries, m.entries);

  auto table = EncodeTensorTable(m.entries);
  REQUIRE(table.ok());
  std::vector<ManifestEntry> decoded;
  REQUIRE(DecodeTensorTable(*table, &decoded).ok());
  CheckSameEntries(decoded, m.entries);

  // Explicit contiguous strides decode as none.
  m.entries[2].strides = {3, 1};
  auto again = ManifestFromJson(ManifestToJson(m));
  REQUIRE(again.ok());
  CHECK(again->entries[2].strides.empty());
  REQUIRE(DecodeTensorTable(EncodeTensorTable(m.entries).value(), &decoded).ok());
  CHECK(decoded[2].strides.empty());

  // Without strides the formats are as before: 6 entry fields, flags 0.
  Manifest plain = Varied();
  CHECK(ManifestToJson(plain)["entry_fields"].size() == 6);
  CHECK(EncodeTensorTable(plain.entries).value()[20] == 0);
}

TEST_CASE("strides that disagree with nbytes, the rank or the sign are refused", "[client][manifest]") {
  struct Case {
    const char* what;
    std::function<void(ManifestEntry&)> damage;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"span", [](ManifestEntry& e) { e.nbytes = 64; }, "shape and strides x dtype size (F32) span 48"},
      {"rank", [](ManifestEntry& e) { e.strides = {1}; }, "field 'strides' has 1 values for a shape of rank 2"},
      {"negative", [](ManifestEntry& e) { e.strides = {-1, 4}; }, "field 'strides' dimension 0 is negative"},
      {"huge", [](ManifestEntry& e) { e.strides = {1, int64_t{1} << 60}; }, "reaches more than 1 TiB"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    Manifest m = Strided();
    c.damage(m.entries[0]);
    Status st = m.Validate(nullptr, "; fix the writer");
    REQUIRE_FALSE(st.ok());
    INFO(st.error().message());
    CHECK(Has(st.error().message(), c.says));
    CHECK(Has(st.error().message(), "; fix the writer"));
    CHECK_FALSE(Has(st.error().message(), "restart the holder"));
  }
}

}  // namespace
}  // namespace wsup
