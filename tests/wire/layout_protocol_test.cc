// The engine-made layout messages (wire/layout_protocol.h): each round-trips,
// and each decoder refuses bad input with an error that names the message
// and the field; the hello's publish and wait_ms; the layout hash.
#include <catch2/catch.hpp>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/text_check.h"
#include "tests/wire/wire_check.h"
#include "wire/layout_protocol.h"
#include "wire/protocol.h"

namespace wsup {
namespace {

using nlohmann::json;

using test::Has;

Fingerprint EngineFp() {
  Fingerprint fp;
  fp.Set("checkpoint", "abc");
  AddEngineLayout(&fp, EngineLayoutId{"wsup-engine", "0.1.0", "fuse_gate_up/v1"});
  return fp;
}

Manifest OneTensor() {
  Manifest m = test::HostManifest({{4096}});
  m.entries = {{"w", "F32", {4, 4}, 0, 0, 64}};
  return m;
}

// Applies `damage` to a copy of `good` and expects the decoder to refuse
// it naming `says`. The message goes through its text, as off a socket.
template <typename Decode>
void Refuses(const json& good, const std::function<void(json&)>& damage, const std::string& says, Decode decode) {
  json j = good;
  damage(j);
  auto r = decode(json::parse(j.dump()));
  test::CheckCorrupt(r, {says});
}

TEST_CASE("layout messages round-trip", "[wire][layout]") {
  LeaseMsg lease;
  lease.layout = 7;
  lease.fingerprint = EngineFp();
  auto l = DecodeLease(EncodeLease(lease));
  REQUIRE(l.ok());
  CHECK(l->layout == 7);
  CHECK(l->fingerprint.Compare(lease.fingerprint).empty());
  CHECK(l->alignment == 256);
  CHECK(l->backend == "host");

  auto a = DecodeAlloc(EncodeAlloc(AllocMsg{12345}));
  REQUIRE(a.ok());
  CHECK(a->bytes == 12345);

  auto g = DecodeGrant(EncodeGrant(GrantMsg{3, 8192, "memfd"}));
  REQUIRE(g.ok());
  CHECK(g->alloc == 3);
  CHECK(g->size == 8192);

  Manifest m = OneTensor();
  const std::string hash = LayoutHash(m.entries);
  auto c = DecodeCommit(EncodeCommit(hash, ManifestToJson(m)));
  REQUIRE(c.ok());
  CHECK(c->layout_hash == hash);
  REQUIRE(c->manifest.entries.size() == 1);
  CHECK(c->manifest.entries[0].name == "w");
  // With the entries in a tensor table.
  std::string table = EncodeTensorTable(m.entries).value();
  auto ct = DecodeCommit(EncodeCommit(hash, ManifestHeaderToJson(m, table.size())), table);
  REQUIRE(ct.ok());
  CHECK(ct->manifest.entries.size() == 1);

  auto ab = DecodeAbort(EncodeAbort(AbortMsg{"out of memory"}));
  REQUIRE(ab.ok());
  CHECK(ab->reason == "out of memory");
  auto abd = DecodeAborted(EncodeAborted(AbortedMsg{9}));
  REQUIRE(abd.ok());
  CHECK(abd->layout == 9);

  LayoutInfo info;
  info.id = 2;
  info.state = "writing";
  info.fingerprint = EngineFp();
  info.writer = "engine-a";
  info.writer_pid = 42;
  info.bytes = 4096;
  auto li = LayoutInfoFromJson(LayoutInfoToJson(info));
  REQUIRE(li.ok());
  CHECK(li->state == "writing");
  CHECK(li->writer == "engine-a");
  CHECK(li->writer_pid == 42);

  HelloMsg h;
  h.client = "e";
  h.fingerprint = EngineFp();
  h.publish = true;
  h.wait_ms = 5000;
  auto hh = DecodeHello(EncodeHello(h));
  REQUIRE(hh.ok());
  CHECK(hh->publish);
  CHECK(hh->wait_ms == 5000);
  // Absent: as before.
  auto plain = DecodeHello(EncodeHello(HelloMsg{}));
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->publish);
  CHECK(plain->wait_ms == 0);
}

TEST_CASE("layout decoders refuse bad input naming the message and the field", "[wire][layout]") {
  LeaseMsg lease;
  lease.layout = 1;
  lease.fingerprint = EngineFp();
  const json good_lease = EncodeLease(lease);
  auto lease_decode = [](const json& j) { return DecodeLease(j); };
  Refuses(good_lease, [](json& j) { j.erase("layout"); }, "'lease' message: field 'layout'", lease_decode);
  Refuses(good_lease, [](json& j) { j["layout"] = -1; }, "field 'layout'", lease_decode);
  Refuses(good_lease, [](json& j) { j["fingerprint"] = "x"; }, "field 'fingerprint'", lease_decode);
  Refuses(good_lease, [](json& j) { j["backend"] = "tpu"; }, "field 'backend' is 'tpu'", lease_decode);
  Refuses(good_lease, [](json& j) { j["device"] = 5000; }, "field 'device' = 5000", lease_decode);
  Refuses(good_lease, [](json& j) { j["alignment"] = 100; }, "powers of two", lease_decode);
  Refuses(good_lease, [](json& j) { j["granularity"] = 0; }, "powers of two", lease_decode);
  Refuses(good_lease, [](json& j) { j["max_allocations"] = 0; }, "'max_allocations' is 0", lease_decode);

  auto alloc_decode = [](const json& j) { return DecodeAlloc(j); };
  Refuses(EncodeAlloc(AllocMsg{1}), [](json& j) { j["bytes"] = 0; }, "'bytes' is 0", alloc_decode);
  Refuses(EncodeAlloc(AllocMsg{1}), [](json& j) { j["bytes"] = "many"; }, "'alloc' message: field 'bytes'",
          alloc_decode);
  Refuses(EncodeAlloc(AllocMsg{1}), [](json& j) { j["bytes"] = -5; }, "field 'bytes'", alloc_decode);

  auto grant_decode = [](const json& j) { return DecodeGrant(j); };
  const json good_grant = EncodeGrant(GrantMsg{0, 4096, "memfd"});
  Refuses(good_grant, [](json& j) { j["handle"] = "shm"; }, "field 'handle' is 'shm'", grant_decode);
  Refuses(good_grant, [](json& j) { j["size"] = 0; }, "field 'size' is 0", grant_decode);
  Refuses(good_grant, [](json& j) { j["alloc"] = 1ull << 40; }, "field 'alloc'", grant_decode);

  Manifest m = OneTensor();
  const json good_commit = EncodeCommit(LayoutHash(m.entries), ManifestToJson(m));
  auto commit_decode = [](const json& j) { return DecodeCommit(j); };
  Refuses(good_commit, [](json& j) { j["layout_hash"] = "ABC"; }, "64 lower-case hex digits", commit_decode);
  Refuses(good_commit, [](json& j) { j.erase("layout_hash"); }, "field 'layout_hash'", commit_decode);
  Refuses(good_commit, [](json& j) { j["manifest"] = 3; }, "'commit' message: field 'manifest'", commit_decode);
  Refuses(good_commit, [](json& j) { j["manifest"]["entries"][0][2] = "wide"; }, "field 'shape'", commit_decode);
  Refuses(good_commit, [](json& j) { j["manifest"]["entry_fields"] = json::array(); }, "entry_fields",
          commit_decode);
  // A table announced but not sent, and one sent but not announced.
  {
    std::string table = EncodeTensorTable(m.entries).value();
    auto r = DecodeCommit(EncodeCommit(LayoutHash(m.entries), ManifestHeaderToJson(m, table.size())));
    REQUIRE_FALSE(r.ok());
    CHECK(Has(r.error().message(), "no table came with it"));
    auto r2 = DecodeCommit(good_commit, table);
    REQUIRE_FALSE(r2.ok());
    CHECK(Has(r2.error().message(), "announces none"));
  }

  auto abort_decode = [](const json& j) { return DecodeAbort(j); };
  Refuses(EncodeAbort(AbortMsg{"x"}), [](json& j) { j["reason"] = "a\nb"; }, "control characters", abort_decode);
  auto aborted_decode = [](const json& j) { return DecodeAborted(j); };
  Refuses(EncodeAborted(AbortedMsg{1}), [](json& j) { j.erase("layout"); }, "'aborted' message: field 'layout'",
          aborted_decode);

  LayoutInfo info;
  info.state = "committed";
  info.fingerprint = EngineFp();
  auto info_decode = [](const json& j) { return LayoutInfoFromJson(j); };
  Refuses(LayoutInfoToJson(info), [](json& j) { j["state"] = "released"; }, "field 'state' is 'released'",
          info_decode);
  Refuses(LayoutInfoToJson(info), [](json& j) { j.erase("tensors"); }, "field 'tensors'", info_decode);
  Refuses(LayoutInfoToJson(info), [](json& j) { j = json::array(); }, "layouts[]", info_decode);

  auto hello_decode = [](const json& j) { return DecodeHello(j); };
  const json good_hello = EncodeHello(HelloMsg{});
  Refuses(good_hello, [](json& j) { j["publish"] = "yes"; }, "'hello' message: field 'publish'", hello_decode);
  Refuses(good_hello, [](json& j) { j["wait_ms"] = -1; }, "field 'wait_ms'", hello_decode);
  Refuses(good_hello, [](json& j) { j["wait_ms"] = 4'000'000; }, "an hour", hello_decode);

  // An info with a bad layouts list.
  InfoMsg im;
  json ij = EncodeInfo(im);
  ij["layouts"] = json::object();
  auto bad_info = DecodeInfo(ij);
  REQUIRE_FALSE(bad_info.ok());
  CHECK(Has(bad_info.error().message(), "field 'layouts'"));
  ij = EncodeInfo(im);
  ij["layout"] = "both";
  REQUIRE_FALSE(DecodeInfo(ij).ok());

  // An attach whose layout is not an object, or id 0.
  AttachMsg am;
  am.manifest = OneTensor();
  am.fingerprint = EngineFp();
  json aj = EncodeLayoutAttach(ManifestToJson(am.manifest), am.fingerprint, 3, "h");
  auto ok = DecodeAttach(aj);
  REQUIRE(ok.ok());
  CHECK(ok->layout_id == 3);
  CHECK(ok->layout_hash == "h");
  aj["layout"] = 3;
  REQUIRE_FALSE(DecodeAttach(aj).ok());
  aj["layout"] = {{"id", 0}, {"hash", "h"}};
  REQUIRE_FALSE(DecodeAttach(aj).ok());
}

TEST_CASE("the layout hash covers every field of every entry, and spells strides one way", "[wire][layout]") {
  Manifest m = OneTensor();
  m.entries.push_back({"b", "F32", {4}, 0, 256, 16});
  const std::string base = LayoutHash(m.entries);
  CHECK(base.size() == 64);
  std::vector<std::function<void(ManifestEntry&)>> changes = {
      [](ManifestEntry& e) { e.name = "v"; },        [](ManifestEntry& e) { e.dtype = "BF16"; },
      [](ManifestEntry& e) { e.shape = {16}; },      [](ManifestEntry& e) { e.offset = 512; },
      [](ManifestEntry& e) { e.alloc = 1; },         [](ManifestEntry& e) { e.nbytes = 32; },
      [](ManifestEntry& e) { e.strides = {1, 4}; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    INFO("change " << i);
    auto copy = m.entries;
    changes[i](copy[0]);
    CHECK(LayoutHash(copy) != base);
  }
  auto spelled = m.entries;
  spelled[0].strides = {4, 1};  // the contiguous ones
  CHECK(LayoutHash(spelled) == base);
  auto swapped = m.entries;
  std::swap(swapped[0], swapped[1]);
  CHECK(LayoutHash(swapped) != base);

  CHECK(ParseHolderLayout("engine").value() == HolderLayout::kEngine);
  CHECK(ParseHolderLayout("checkpoint").value() == HolderLayout::kCheckpoint);
  auto bad = ParseHolderLayout("both");
  REQUIRE_FALSE(bad.ok());
  CHECK(Has(bad.error().message(), "not one of checkpoint"));
}

}  // namespace
}  // namespace wsup
