// group/epoch.h: the epoch record's codec and a member's decisions, as pure
// logic. The race of two members proposing over a real etcd is in
// etcd_test.cc.
#include "group/epoch.h"

#include <catch2/catch.hpp>

using wsup::group::DecodeEpoch, wsup::group::EncodeEpoch, wsup::group::EpochRecord, wsup::group::EpochTracker,
    wsup::group::Side;

namespace {

EpochRecord Record(int64_t epoch, Side active, int64_t rev) {
  EpochRecord r;
  r.epoch = epoch;
  r.active = active;
  r.mod_revision = rev;
  return r;
}

}  // namespace

TEST_CASE("epoch record: encoded and decoded whole - a value nobody of ours wrote is refused saying what is wrong",
          "[group]") {
  EpochRecord r = Record(7, Side::kStandby, 0);
  r.by = 2;
  r.trigger = "crash of member 2 rank 0";
  auto back = DecodeEpoch(EncodeEpoch(r), 41);
  REQUIRE(back.ok());
  CHECK(back->epoch == 7);
  CHECK(back->active == Side::kStandby);
  CHECK(back->by == 2);
  CHECK(back->trigger == "crash of member 2 rank 0");
  CHECK(back->mod_revision == 41);
  CHECK(wsup::group::EpochKey("dsv3") == "/wsup/groups/dsv3/epoch");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "not a JSON object"},
      {"[1]", "not a JSON object"},
      {R"({"active":"primary"})", "\"epoch\" is not a positive integer"},
      {R"({"epoch":0,"active":"primary"})", "\"epoch\" is not a positive integer"},
      {R"({"epoch":"3","active":"primary"})", "\"epoch\" is not a positive integer"},
      {R"({"epoch":3,"active":"left"})", "neither \"primary\" nor \"standby\""},
  };
  for (const auto& [value, words] : bad) {
    auto d = DecodeEpoch(value, 1);
    INFO(value);
    REQUIRE_FALSE(d.ok());
    CHECK(d.error().code() == wsup::Code::kCorrupt);
    CHECK(d.error().message().find(words) != std::string::npos);
    CHECK(d.error().message().find("remove the key") != std::string::npos);
  }
}

TEST_CASE("epoch tracker: only newer epochs are applied - a late or replayed record never moves a member back",
          "[group]") {
  EpochTracker t(0);
  CHECK_FALSE(t.applied().has_value());
  // Nothing is known before the key is read: no proposal.
  CHECK_FALSE(t.Propose(Side::kPrimary, "crash").has_value());
  CHECK(t.Observe(Record(1, Side::kPrimary, 10)));
  CHECK_FALSE(t.Observe(Record(1, Side::kPrimary, 10)));
  CHECK(t.Observe(Record(3, Side::kStandby, 30)));
  CHECK_FALSE(t.Observe(Record(2, Side::kPrimary, 20)));  // late
  REQUIRE(t.applied().has_value());
  CHECK(t.applied()->epoch == 3);
  CHECK(t.applied()->active == Side::kStandby);
  // The same epoch at a newer revision: not a swap, but the revision to
  // compare against next.
  CHECK_FALSE(t.Observe(Record(3, Side::kStandby, 31)));
  CHECK(t.applied()->mod_revision == 31);
}

TEST_CASE("epoch tracker: an active rank's death proposes the other side once - a standby's proposes nothing",
          "[group]") {
  EpochTracker t(1);
  REQUIRE(t.Observe(Record(4, Side::kPrimary, 40)));
  CHECK_FALSE(t.Propose(Side::kStandby, "standby crash").has_value());
  auto p = t.Propose(Side::kPrimary, "crash of member 1 rank 0");
  REQUIRE(p.has_value());
  CHECK(p->expect_mod_revision == 40);
  CHECK(p->next.epoch == 5);
  CHECK(p->next.active == Side::kStandby);
  CHECK(p->next.by == 1);
  CHECK(p->next.trigger == "crash of member 1 rank 0");
  CHECK(t.proposing());
  // A second death while the first proposal is out adds nothing.
  CHECK_FALSE(t.Propose(Side::kPrimary, "another rank").has_value());

  SECTION("won: its own record comes back and is applied") {
    EpochRecord mine = p->next;
    mine.mod_revision = 41;
    CHECK(t.Proposed(mine));
    CHECK_FALSE(t.proposing());
    CHECK(t.applied()->epoch == 5);
    CHECK(t.applied()->active == Side::kStandby);
    // Its watch echo changes nothing.
    CHECK_FALSE(t.Observe(mine));
  }
  SECTION("lost: the winner's record is applied instead") {
    EpochRecord theirs = Record(5, Side::kStandby, 41);
    theirs.by = 0;
    CHECK(t.Proposed(theirs));
    CHECK(t.applied()->by == 0);
  }
  SECTION("no answer: nothing changed, and the next death proposes again") {
    t.ProposalFailed();
    CHECK(t.applied()->epoch == 4);
    CHECK(t.Propose(Side::kPrimary, "crash, again").has_value());
  }
}
