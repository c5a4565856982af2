// group/etcd.h against a real etcd (Debian's etcd-server, installed by
// scripts/setup.sh; skipped with a message where it is missing): puts and
// gets, the compare-and-put a group's epoch is fenced by, leases, watches,
// an endpoint that is down beside one that is up, etcd killed under a
// watch. The parsing of endpoints and base64 needs no etcd.
#include "group/etcd.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "group/epoch.h"
#include "group/group_link.h"
#include "http/loop_timer.h"
#include "testkit/test_util.h"

using namespace std::chrono_literals;
using wsup::Result;
namespace group = wsup::group;
using group::EtcdClient, group::EtcdEndpoint, group::KeyValue, group::WatchEvent;
using group::EpochRecord, group::EpochTracker, group::GroupLink, group::MemberRecord, group::MemberView, group::Side;

namespace {

constexpr const char* kEtcd = "/usr/bin/etcd";

// A libuv loop run by the test thread until an answer is in.
class Loop {
 public:
  Loop() { REQUIRE(uv_loop_init(&loop_) == 0); }
  ~Loop() {
    client_.reset();
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
  }
  uv_loop_t* get() { return &loop_; }
  EtcdClient& Client(std::vector<EtcdEndpoint> endpoints) {
    auto c = EtcdClient::Create(&loop_, std::move(endpoints), 2000);
    if (!c.ok()) FAIL(c.error().ToString());
    client_ = std::move(*c);
    return *client_;
  }
  // Runs the loop until `ready` holds or `limit` passes (every call in
  // flight has a timer, so each turn returns).
  bool RunUntil(const std::function<bool()>& ready, std::chrono::milliseconds limit = 10s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!ready()) {
      if (std::chrono::steady_clock::now() > end) return false;
      uv_run(&loop_, UV_RUN_ONCE);
    }
    return true;
  }
  template <typename T>
  Result<T> Await(const std::function<void(EtcdClient::Done<T>)>& call) {
    std::optional<Result<T>> out;
    call([&](Result<T> r) { out.emplace(std::move(r)); });
    if (!RunUntil([&] { return out.has_value(); })) return wsup::Error(wsup::Code::kTimeout, "no answer in 10 s");
    return std::move(*out);
  }

 private:
  uv_loop_t loop_;
  std::unique_ptr<EtcdClient> client_;
};

// One etcd member on loopback ports of its own, its data in a temporary
// folder.
class Etcd {
 public:
  explicit Etcd(const wsup::test::TempDir& dir) : port_(wsup::test::FreeLoopbackPort()) {
    const std::string client = "http://127.0.0.1:" + std::to_string(port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(wsup::test::FreeLoopbackPort());
    log_ = dir.Join("etcd.log");
    child_ = wsup::test::Child::Start({kEtcd, "--name", "t", "--data-dir", dir.Join("etcd"), "--listen-client-urls",
                                       client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
                                       "--initial-advertise-peer-urls", peer, "--initial-cluster", "t=" + peer,
                                       "--log-level", "warn"},
                                      log_);
  }
  ~Etcd() { Stop(); }
  void Stop() {
    if (!child_.running()) return;
    child_.Kill(SIGKILL);
    child_.Wait(10s);
  }
  // SIGSTOP: etcd unreachable (its port still accepts, nothing answers).
  void Signal(int sig) { child_.Kill(sig); }
  EtcdEndpoint endpoint() const { return {"127.0.0.1", port_}; }
  std::string Log() const { return wsup::test::ReadAll(log_); }

 private:
  int port_;
  std::string log_;
  wsup::test::Child child_;
};

bool HaveEtcd() {
  if (::access(kEtcd, X_OK) == 0) return true;
  WARN("skipped: " << kEtcd << " is not installed (scripts/setup.sh installs Debian's etcd-server package)");
  return false;
}

// Waits (bounded) until etcd answers a get.
void WaitReady(Loop& loop, EtcdClient& c, const Etcd& etcd) {
  const bool up = wsup::test::WaitFor(
      [&] {
        auto r = loop.Await<std::optional<KeyValue>>([&](auto done) { c.Get("ready?", std::move(done)); });
        return r.ok();
      },
      30s);
  INFO(etcd.Log());
  REQUIRE(up);
}

// A fresh etcd and a client of it on the test's loop, once etcd answers.
struct Running {
  wsup::test::TempDir dir;
  Etcd etcd{dir};
  Loop loop;
  EtcdClient* client = nullptr;
  explicit Running(std::vector<EtcdEndpoint> before = {}) {
    before.push_back(etcd.endpoint());
    client = &loop.Client(std::move(before));
    WaitReady(loop, *client, etcd);
  }
};

}  // namespace

TEST_CASE("etcd endpoints: http://HOST:PORT with an IP or localhost - anything else says what is allowed", "[etcd]") {
  auto ok = wsup::group::ParseEtcdEndpoint("http://10.0.0.1:2379");
  REQUIRE(ok.ok());
  CHECK(ok->host == "10.0.0.1");
  CHECK(ok->port == 2379);
  CHECK(ok->ToString() == "http://10.0.0.1:2379");
  auto v6 = wsup::group::ParseEtcdEndpoint("http://[::1]:2379");
  REQUIRE(v6.ok());
  CHECK(v6->host == "::1");
  CHECK(v6->ToString() == "http://[::1]:2379");
  CHECK(wsup::group::ParseEtcdEndpoint("http://localhost:2379").ok());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"10.0.0.1:2379", "not an http:// URL"},
      {"https://10.0.0.1:2379", "https is not supported"},
      {"http://10.0.0.1", "no port"},
      {"http://10.0.0.1:2379/v3", "the port is not a number"},
      {"http://10.0.0.1:0", "out of range"},
      {"http://etcd.example:2379", "is not an IP address (names are not resolved)"},
      {"http://[::1:2379", "without its ']'"},
  };
  for (const auto& [url, words] : bad) {
    auto r = wsup::group::ParseEtcdEndpoint(url);
    INFO(url);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message().find(words) != std::string::npos);
    CHECK(r.error().message().find("http://HOST:PORT") != std::string::npos);
  }
}

TEST_CASE("etcd client: no endpoints or a timeout below 1 ms is refused, naming group.etcd or the timeout", "[etcd]") {
  Loop loop;
  auto none = EtcdClient::Create(loop.get(), {}, 2000);
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().code() == wsup::Code::kInvalidArgument);
  CHECK_THAT(none.error().message(), Catch::Contains("group.etcd"));
  auto zero = EtcdClient::Create(loop.get(), {EtcdEndpoint{"127.0.0.1", 2379}}, 0);
  REQUIRE_FALSE(zero.ok());
  CHECK_THAT(zero.error().message(), Catch::Contains("at least 1 ms"));
  CHECK(EtcdClient::Create(loop.get(), {EtcdEndpoint{"127.0.0.1", 2379}}, 1).ok());
}

TEST_CASE("etcd base64: every byte round-trips, padding of each length, bad text refused", "[etcd]") {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n = 0; n <= all.size(); n += (n < 8 ? 1 : 37)) {
    const std::string s = all.substr(0, n);
    auto back = wsup::group::Base64Decode(wsup::group::Base64Encode(s));
    REQUIRE(back.ok());
    CHECK(*back == s);
  }
  CHECK(wsup::group::Base64Encode("ab") == "YWI=");
  CHECK_FALSE(wsup::group::Base64Decode("YWI").ok());
  CHECK_FALSE(wsup::group::Base64Decode("Y!I=").ok());
}

TEST_CASE("etcd client: put, get and prefix on a real etcd - bytes of every value kept, absent keys absent",
          "[etcd]") {
  if (!HaveEtcd()) return;
  Running run;
  Loop& loop = run.loop;
  EtcdClient& c = *run.client;
  const std::string bytes("v\0\xff\n", 4);
  auto rev = loop.Await<int64_t>([&](auto done) { c.Put("/g/a", bytes, 0, std::move(done)); });
  REQUIRE(rev.ok());
  CHECK(*rev > 0);
  REQUIRE(loop.Await<int64_t>([&](auto done) { c.Put("/g/b", "2", 0, std::move(done)); }).ok());
  REQUIRE(loop.Await<int64_t>([&](auto done) { c.Put("/h", "3", 0, std::move(done)); }).ok());
  auto a = loop.Await<std::optional<KeyValue>>([&](auto done) { c.Get("/g/a", std::move(done)); });
  REQUIRE(a.ok());
  REQUIRE(a->has_value());
  CHECK((*a)->value == bytes);
  CHECK((*a)->mod_revision == *rev);
  auto none = loop.Await<std::optional<KeyValue>>([&](auto done) { c.Get("/g/none", std::move(done)); });
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());
  auto g = loop.Await<std::vector<KeyValue>>([&](auto done) { c.GetPrefix("/g/", std::move(done)); });
  REQUIRE(g.ok());
  REQUIRE(g->size() == 2);
  CHECK((*g)[0].key == "/g/a");
  CHECK((*g)[1].key == "/g/b");
}

TEST_CASE("etcd client: compare-and-put - of two proposals from one revision exactly one wins", "[etcd]") {
  if (!HaveEtcd()) return;
  Running run;
  Loop& loop = run.loop;
  EtcdClient& c = *run.client;
  using R = EtcdClient::PutIfResult;
  auto first = loop.Await<R>([&](auto done) { c.PutIf("/g/epoch", 0, "1 primary", 0, std::move(done)); });
  REQUIRE(first.ok());
  CHECK(first->succeeded);
  auto again = loop.Await<R>([&](auto done) { c.PutIf("/g/epoch", 0, "1 standby", 0, std::move(done)); });
  REQUIRE(again.ok());
  CHECK_FALSE(again->succeeded);
  REQUIRE(again->current.has_value());
  CHECK(again->current->value == "1 primary");
  const int64_t seen = again->current->mod_revision;
  // Two members propose the next epoch from what they both saw.
  std::optional<Result<R>> x, y;
  c.PutIf("/g/epoch", seen, "2 standby", 0, [&](Result<R> r) { x.emplace(std::move(r)); });
  c.PutIf("/g/epoch", seen, "2 primary", 0, [&](Result<R> r) { y.emplace(std::move(r)); });
  REQUIRE(loop.RunUntil([&] { return x && y; }));
  REQUIRE(x->ok());
  REQUIRE(y->ok());
  CHECK((*x)->succeeded != (*y)->succeeded);
  const std::string winner = (*x)->succeeded ? "2 standby" : "2 primary";
  const Result<R>& loser = (*x)->succeeded ? *y : *x;
  REQUIRE(loser->current.has_value());
  CHECK(loser->current->value == winner);
}

TEST_CASE("etcd client: a lease keeps its keys while renewed, and revoking it deletes them", "[etcd]") {
  if (!HaveEtcd()) return;
  Running run;
  Loop& loop = run.loop;
  EtcdClient& c = *run.client;
  auto lease = loop.Await<int64_t>([&](auto done) { c.GrantLease(5, std::move(done)); });
  REQUIRE(lease.ok());
  REQUIRE(loop.Await<int64_t>([&](auto done) { c.Put("/g/members/1", "alive", *lease, std::move(done)); }).ok());
  auto ttl = loop.Await<int64_t>([&](auto done) { c.KeepAlive(*lease, std::move(done)); });
  REQUIRE(ttl.ok());
  CHECK(*ttl == 5);
  auto kv = loop.Await<std::optional<KeyValue>>([&](auto done) { c.Get("/g/members/1", std::move(done)); });
  REQUIRE(kv.ok());
  REQUIRE(kv->has_value());
  CHECK((*kv)->lease == *lease);
  REQUIRE(loop.Await<bool>([&](auto done) { c.Revoke(*lease, std::move(done)); }).ok());
  auto gone = loop.Await<std::optional<KeyValue>>([&](auto done) { c.Get("/g/members/1", std::move(done)); });
  REQUIRE(gone.ok());
  CHECK_FALSE(gone->has_value());
  // A lease that is gone renews to nothing.
  auto after = loop.Await<int64_t>([&](auto done) { c.KeepAlive(*lease, std::move(done)); });
  REQUIRE(after.ok());
  CHECK(*after == 0);
}

TEST_CASE("etcd client: a watch gets each committed put in order - cancelled it stops, etcd killed it ends with an "
          "error",
          "[etcd]") {
  if (!HaveEtcd()) return;
  Running run;
  Loop& loop = run.loop;
  EtcdClient& c = *run.client;
  std::vector<WatchEvent> seen;
  std::optional<wsup::Error> ended;
  auto on = [&](Result<std::vector<WatchEvent>> r) {
    if (!r.ok()) return ended.emplace(r.error()), void();
    for (auto& e : *r) seen.push_back(std::move(e));
  };
  // From revision 1: nothing is missed between the watch's start and the puts.
  const auto id = c.Watch("/g/", true, 1, on);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(loop.Await<int64_t>([&](auto done) { c.Put("/g/k" + std::to_string(i), std::to_string(i), 0, std::move(done)); }).ok());
  }
  REQUIRE(loop.Await<int64_t>([&](auto done) { c.Put("/other", "x", 0, std::move(done)); }).ok());
  REQUIRE(loop.RunUntil([&] { return seen.size() >= 3; }));
  REQUIRE(seen.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(seen[static_cast<size_t>(i)].kv.key == "/g/k" + std::to_string(i));
    CHECK(seen[static_cast<size_t>(i)].kv.value == std::to_string(i));
    CHECK_FALSE(seen[static_cast<size_t>(i)].deleted);
    if (i > 0) CHECK(seen[static_cast<size_t>(i)].kv.mod_revision > seen[static_cast<size_t>(i) - 1].kv.mod_revision);
  }
  c.CancelWatch(id);
  REQUIRE(loop.Await<int64_t>([&](auto done) { c.Put("/g/k9", "9", 0, std::move(done)); }).ok());
  CHECK(seen.size() == 3);
  CHECK_FALSE(ended.has_value());

  // A second watch, then etcd dies under it.
  c.Watch("/g/", true, 0, on);
  REQUIRE(loop.Await<int64_t>([&](auto done) { c.Put("/g/k10", "10", 0, std::move(done)); }).ok());
  REQUIRE(loop.RunUntil([&] { return seen.size() == 4; }));
  run.etcd.Stop();
  REQUIRE(loop.RunUntil([&] { return ended.has_value(); }));
  CHECK(ended->message().find("watch") != std::string::npos);
}

TEST_CASE("etcd client: an endpoint that is down is passed over - none up names each and the fix", "[etcd]") {
  if (!HaveEtcd()) return;
  const EtcdEndpoint dead{"127.0.0.1", wsup::test::FreeLoopbackPort()};
  Running run({dead});
  Loop& loop = run.loop;
  EtcdClient& c = *run.client;
  Etcd& etcd = run.etcd;
  for (int i = 0; i < 3; ++i) {
    auto r = loop.Await<int64_t>([&](auto done) { c.Put("/g/x", std::to_string(i), 0, std::move(done)); });
    INFO(i);
    CHECK(r.ok());
  }
  etcd.Stop();
  auto down = loop.Await<std::optional<KeyValue>>([&](auto done) { c.Get("/g/x", std::move(done)); });
  REQUIRE_FALSE(down.ok());
  CHECK(down.error().code() == wsup::Code::kUnavailable);
  CHECK(down.error().message().find(dead.ToString()) != std::string::npos);
  CHECK(down.error().message().find(etcd.endpoint().ToString()) != std::string::npos);
  CHECK(down.error().message().find("start etcd or check group.etcd") != std::string::npos);
}

TEST_CASE("etcd client: two members that see the active side die at once - one epoch, one side, applied alike by "
          "both and by a watcher",
          "[etcd][group]") {
  if (!HaveEtcd()) return;
  Running run;
  Loop& loop = run.loop;
  EtcdClient& c = *run.client;
  const std::string key = wsup::group::EpochKey("g");
  EpochRecord first;
  first.epoch = 1;
  first.active = Side::kPrimary;
  using R = EtcdClient::PutIfResult;
  auto created = loop.Await<R>([&](auto done) { c.PutIf(key, 0, wsup::group::EncodeEpoch(first), 0, std::move(done)); });
  REQUIRE(created.ok());
  REQUIRE(created->succeeded);

  // Three members read the key; member 2 only watches.
  std::vector<EpochTracker> members = {EpochTracker(0), EpochTracker(1), EpochTracker(2)};
  auto read = loop.Await<std::optional<KeyValue>>([&](auto done) { c.Get(key, std::move(done)); });
  REQUIRE(read.ok());
  REQUIRE(read->has_value());
  for (auto& m : members) {
    auto rec = wsup::group::DecodeEpoch((*read)->value, (*read)->mod_revision);
    REQUIRE(rec.ok());
    CHECK(m.Observe(*rec));
  }
  std::vector<EpochRecord> watched;
  // (No REQUIRE inside a loop callback: it would throw through libuv.)
  std::optional<wsup::Error> watch_error;
  c.Watch(key, false, (*read)->mod_revision + 1, [&](Result<std::vector<WatchEvent>> r) {
    if (!r.ok()) return watch_error.emplace(r.error()), void();
    for (const auto& e : *r) {
      auto rec = wsup::group::DecodeEpoch(e.kv.value, e.kv.mod_revision);
      if (!rec.ok()) return watch_error.emplace(rec.error()), void();
      if (members[2].Observe(*rec)) watched.push_back(*rec);
    }
  });

  // Members 0 and 1 both see a primary rank die and propose.
  std::optional<Result<R>> answers[2];
  for (int i = 0; i < 2; ++i) {
    auto p = members[static_cast<size_t>(i)].Propose(Side::kPrimary, "crash seen by member " + std::to_string(i));
    REQUIRE(p.has_value());
    c.PutIf(key, p->expect_mod_revision, wsup::group::EncodeEpoch(p->next), 0,
            [&answers, i](Result<R> r) { answers[i].emplace(std::move(r)); });
  }
  REQUIRE(loop.RunUntil([&] { return answers[0] && answers[1]; }));
  int won = 0;
  for (int i = 0; i < 2; ++i) {
    REQUIRE(answers[i]->ok());
    const R& r = **answers[i];
    won += r.succeeded ? 1 : 0;
    // What is in etcd now: the proposal itself when it won, the winner's
    // record when it lost.
    EpochRecord now;
    if (r.succeeded) {
      auto kv = loop.Await<std::optional<KeyValue>>([&](auto done) { c.Get(key, std::move(done)); });
      REQUIRE(kv.ok());
      REQUIRE(kv->has_value());
      auto rec = wsup::group::DecodeEpoch((*kv)->value, (*kv)->mod_revision);
      REQUIRE(rec.ok());
      now = *rec;
    } else {
      REQUIRE(r.current.has_value());
      auto rec = wsup::group::DecodeEpoch(r.current->value, r.current->mod_revision);
      REQUIRE(rec.ok());
      now = *rec;
    }
    members[static_cast<size_t>(i)].Proposed(now);
  }
  CHECK(won == 1);
  REQUIRE(loop.RunUntil([&] { return !watched.empty() || watch_error.has_value(); }));
  CHECK_FALSE(watch_error.has_value());
  for (const auto& m : members) {
    REQUIRE(m.applied().has_value());
    CHECK(m.applied()->epoch == 2);
    CHECK(m.applied()->active == Side::kStandby);
    CHECK(m.applied()->by == members[0].applied()->by);
  }
  CHECK(watched.size() == 1);
}

TEST_CASE("group link: members see each other join, republish and go - a crashed member's key goes with its lease, "
          "and members cut off from etcd stop counting on theirs until it answers again",
          "[etcd][group]") {
  if (!HaveEtcd()) return;
  Running run;
  Loop& loop = run.loop;
  wsup::LoopTimerSource timers(loop.get());
  struct Seen {
    std::vector<bool> lease;       // each change of the member's own lease
    std::map<int, bool> members;   // the others' last standing
    std::vector<std::string> errors;
    bool valid() const { return !lease.empty() && lease.back(); }
  };
  Seen sa, sb;
  auto make = [&](int index, Seen& s) {
    GroupLink::Options o;
    o.group = "g";
    o.index = index;
    o.size = 2;
    o.lease_ttl_ms = 2000;  // etcd's smallest with its default election timeout
    GroupLink::Hooks h;
    h.lease = [&s](bool v) { s.lease.push_back(v); };
    h.member = [&s](const MemberView::Change& c) { s.members[c.index] = c.alive; };
    h.error = [&s](const wsup::Error& e) { s.errors.push_back(e.message()); };
    return std::make_unique<GroupLink>(*run.client, timers, wsup::RealClock(), o, h);
  };
  auto a = make(0, sa);
  auto b = make(1, sb);
  a->Start();
  b->Start();
  REQUIRE(loop.RunUntil([&] { return sa.valid() && sb.valid() && sa.members[1] && sb.members[0]; }));
  CHECK(a->valid());
  REQUIRE(loop.RunUntil([&] { return a->view().alive_count() == 2; }));

  MemberRecord r;
  r.epoch = 4;
  r.primary = "serving";
  r.standby = "ready";
  b->Publish(r);
  REQUIRE(loop.RunUntil([&] { return a->view().Record(1) && a->view().Record(1)->epoch == 4; }));
  CHECK(a->view().Record(1)->primary == "serving");

  // A crash: b's keepalives stop, its lease is not revoked. Its key goes
  // when etcd expires the lease.
  b->Abandon();
  REQUIRE(loop.RunUntil([&] { return !sa.members[1]; }));
  CHECK(sa.valid());  // a kept its own
  b->Start();
  REQUIRE(loop.RunUntil([&] { return sa.members[1]; }));

  // etcd stops answering: each member's lease can no longer be counted on
  // within the TTL, though nothing told it so.
  run.etcd.Signal(SIGSTOP);
  REQUIRE(loop.RunUntil([&] { return !sa.valid() && !sb.valid(); }));
  CHECK_FALSE(a->valid());
  run.etcd.Signal(SIGCONT);
  // Back: each renews or, when etcd expired the lease meanwhile, rejoins
  // under a new one; either way both are members again.
  // (A member's own key comes back to its view through the watch, a little
  // after the put that made its lease usable.)
  REQUIRE(loop.RunUntil([&] { return sa.valid() && sb.valid() && sa.members[1] && sb.members[0]; }, 20s));
  REQUIRE(loop.RunUntil([&] { return a->view().alive_count() == 2 && b->view().alive_count() == 2; }));
  CHECK(sa.errors.empty());
  CHECK(sb.errors.empty());
}
