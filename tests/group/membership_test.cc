// group/membership.h: member keys and records, a member's view of its own
// lease, and of the other members' keys. Pure logic: times are given.
#include "group/membership.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace wsup::group;

namespace {

KeyValue Kv(int index, int64_t epoch, int64_t rev, const std::string& group = "g") {
  MemberRecord r;
  r.index = index;
  r.epoch = epoch;
  r.primary = "serving";
  r.standby = "ready";
  return KeyValue{MemberKey(group, index), EncodeMember(r), rev, rev, 1, 7};
}

WatchEvent Put(int index, int64_t epoch, int64_t rev) { return WatchEvent{false, Kv(index, epoch, rev)}; }

WatchEvent Del(int index, int64_t rev) {
  WatchEvent e;
  e.deleted = true;
  e.kv.key = MemberKey("g", index);
  e.kv.mod_revision = rev;
  return e;
}

}  // namespace

TEST_CASE("group members: keys name their index, records round-trip, and a bad value names the fix", "[group]") {
  CHECK(MembersPrefix("g") == "/wsup/groups/g/members/");
  CHECK(MemberKey("g", 3) == "/wsup/groups/g/members/3");
  const std::string p = MembersPrefix("g");
  CHECK(MemberIndexOf(MemberKey("g", 12), p) == 12);
  for (const char* bad : {"/wsup/groups/g/members/", "/wsup/groups/g/members/01", "/wsup/groups/g/members/+1",
                          "/wsup/groups/g/members/x", "/wsup/groups/g/members/-1", "/wsup/groups/h/members/1",
                          "/wsup/groups/g/members/1/extra"}) {
    INFO(bad);
    CHECK_FALSE(MemberIndexOf(bad, p).has_value());
  }

  MemberRecord r;
  r.index = 2;
  r.epoch = 9;
  r.primary = "serving";
  r.standby = "starting";
  auto back = DecodeMember(EncodeMember(r), 2, 77);
  REQUIRE(back.ok());
  CHECK(back->index == 2);
  CHECK(back->epoch == 9);
  CHECK(back->primary == "serving");
  CHECK(back->standby == "starting");
  CHECK(back->lease == 77);

  for (const auto& [value, says] : std::vector<std::pair<std::string, std::string>>{
           {"not json", "not a JSON object"},
           {R"({"index": 3, "epoch": 1})", "not the key's index"},
           {R"({"index": 2, "epoch": -1})", "\"epoch\""},
           {R"({"index": 2})", "\"epoch\""}}) {
    INFO(value);
    auto d = DecodeMember(value, 2, 0);
    REQUIRE_FALSE(d.ok());
    CHECK(d.error().code() == wsup::Code::kCorrupt);
    CHECK_THAT(d.error().message(), Catch::Contains(says));
    CHECK_THAT(d.error().message(), Catch::Contains("remove the key"));
  }
}

TEST_CASE("group own lease: valid until the last answered send plus the TTL less the margin - never longer than "
          "asked, never moved back",
          "[group]") {
  OwnLease l(2000, 100);
  CHECK_FALSE(l.Valid(0));
  l.Granted(5, 1000, 2);
  CHECK(l.id() == 5);
  CHECK(l.Valid(2899));
  CHECK_FALSE(l.Valid(2900));  // 1000 + 2000 - 100
  CHECK(l.NextKeepAliveMs() == 1000 + 666);

  // A renewal counts from its send time.
  l.Renewed(1600, 2);
  CHECK(l.valid_until_ms() == 3500);
  CHECK(l.NextKeepAliveMs() == 1600 + 666);
  // etcd may raise a TTL: the member still counts the one it asked for.
  l.Renewed(1700, 60);
  CHECK(l.valid_until_ms() == 3600);
  // A late answer to an earlier send moves nothing back.
  l.Renewed(1650, 2);
  CHECK(l.valid_until_ms() == 3600);
  CHECK(l.NextKeepAliveMs() == 1700 + 666);
  // A TTL of 0 is not a renewal.
  l.Renewed(3000, 0);
  CHECK(l.valid_until_ms() == 3600);

  l.Lost();
  CHECK(l.id() == 0);
  CHECK_FALSE(l.Valid(1800));
  // No renewal of a lease that is gone.
  l.Renewed(1800, 2);
  CHECK_FALSE(l.Valid(1900));
}

TEST_CASE("group member view: a read then watched events - changes once per member, old events skipped, a stray "
          "key refused whole",
          "[group]") {
  const std::string p = MembersPrefix("g");
  MemberView v(3);
  auto first = v.Reset({Kv(0, 1, 10), Kv(2, 1, 12)}, p, 12);
  REQUIRE(first.ok());
  REQUIRE(first->size() == 2);
  CHECK((*first)[0].index == 0);
  CHECK((*first)[0].alive);
  CHECK((*first)[1].index == 2);
  CHECK(v.alive(0));
  CHECK_FALSE(v.alive(1));
  CHECK(v.alive_count() == 2);
  CHECK(v.revision() == 12);

  // Member 1 joins, member 0 republishes (no change of standing), member 2 goes.
  auto c = v.Apply({Put(1, 1, 13), Put(0, 2, 14), Del(2, 15)}, p);
  REQUIRE(c.ok());
  REQUIRE(c->size() == 2);
  CHECK((*c)[0].index == 1);
  CHECK((*c)[0].alive);
  CHECK((*c)[1].index == 2);
  CHECK_FALSE((*c)[1].alive);
  CHECK(v.Record(0)->epoch == 2);
  CHECK(v.revision() == 15);

  // A watch restarted from earlier replays what the view holds: nothing moves.
  auto replay = v.Apply({Put(2, 1, 12), Del(1, 13)}, p);
  REQUIRE(replay.ok());
  CHECK(replay->empty());
  CHECK(v.alive(1));
  CHECK_FALSE(v.alive(2));

  // A key of a bigger group, or a value that does not decode: an error, and
  // none of the batch applied.
  auto stray = v.Apply({Del(0, 16), Put(5, 1, 17)}, p);
  REQUIRE_FALSE(stray.ok());
  CHECK_THAT(stray.error().message(), Catch::Contains("/wsup/groups/g/members/5"));
  CHECK_THAT(stray.error().message(), Catch::Contains("wsup check"));
  CHECK(v.alive(0));
  WatchEvent junk = Put(1, 1, 18);
  junk.kv.value = "{}";
  REQUIRE_FALSE(v.Apply({Del(0, 16), junk}, p).ok());
  CHECK(v.alive(0));
  CHECK(v.revision() == 15);

  // A fresh read replaces the view whole.
  auto again = v.Reset({Kv(2, 3, 20)}, p, 20);
  REQUIRE(again.ok());
  CHECK(again->size() == 3);  // 0 and 1 went, 2 came
  CHECK(v.alive_count() == 1);
  CHECK(v.Record(7) == std::nullopt);
}
