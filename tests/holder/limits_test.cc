// The holder's connection limits against a real wsup-holder: idle
// connections are closed after every request, not only before the first;
// at max_connections the connection idle longest makes room, so idle
// clients never lock an engine out; a connection with a request in flight
// is never the one closed; an attached keeper keeps its link.
//
// "The holder has read these bytes" is observed, not assumed: on a Unix
// socket SIOCOUTQ counts the bytes the peer has not read yet.

#include <linux/sockios.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <cerrno>

#include "client/client.h"
#include "tests/holder/holder_fixture.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using test::HolderProcess, test::StartHolder, test::TempDir;

const std::string kModel = "llama-tiny-f32";

// True when this process may open `needed` files; raises the soft limit
// within the hard one when that suffices (the holder, our child, inherits
// it). Otherwise says what to raise and returns false.
bool HaveOpenFiles(rlim_t needed) {
  rlimit lim{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &lim) == 0);
  if (lim.rlim_cur < needed && lim.rlim_max >= needed) {
    lim.rlim_cur = needed;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &lim) == 0);
  }
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &lim) == 0);
  if (lim.rlim_cur < needed) {
    WARN("SKIP: this test needs " << needed << " open files; ulimit -n is " << lim.rlim_cur << " (hard "
                                  << lim.rlim_max << "): raise it with ulimit -n " << needed);
    return false;
  }
  return true;
}

Channel Connect(const HolderProcess& h) {
  auto ch = Channel::Connect(h.socket, 5000);
  REQUIRE(ch.ok());
  return std::move(ch).value();
}

void SendRaw(int fd, const std::string& bytes) {
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
}

// Waits until the holder has read everything sent on fd.
bool HolderReadAll(int fd) {
  return test::WaitFor(
      [&] {
        int unread = -1;
        return ::ioctl(fd, SIOCOUTQ, &unread) == 0 && unread == 0;
      },
      10s);
}

// Nothing arrived on the connection and it is still open.
bool OpenAndQuiet(int fd) {
  char b;
  ssize_t n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// The holder's parting word on a connection it closed, then EOF.
void CheckClosedWith(Channel& ch, const std::string& code, const std::string& says) {
  auto last = ch.Receive(10000);
  REQUIRE(last.ok());
  REQUIRE(last->type() == "error");
  CHECK(last->msg["code"] == code);
  CHECK_THAT(last->msg["message"].get<std::string>(), Catch::Contains(says));
  auto eof = ch.Receive(5000);
  REQUIRE_FALSE(eof.ok());
  CHECK(eof.error().code() == Code::kUnavailable);
}

// A keeper's hello in one frame, cut in two: the holder has a request in
// flight from the first part on.
struct SplitHello {
  std::string head, tail;
};
SplitHello KeeperHelloInTwo(const std::string& name) {
  HelloMsg hello;
  hello.client = name;
  hello.role = ClientRole::kKeeper;
  auto frame = EncodeFrame(EncodeHello(hello));
  REQUIRE(frame.ok());
  size_t cut = frame->size() / 2;
  return {frame->substr(0, cut), frame->substr(cut)};
}

AttachOptions Engine(const HolderProcess& h, const std::string& name) {
  AttachOptions o;
  o.socket_path = h.socket;
  o.client_name = name;
  return o;
}

void StopHolder(HolderProcess& h) {
  h.child.Kill(SIGTERM);
  CHECK(h.child.Wait(30s) == 0);
}

TEST_CASE("a thousand idle info connections never keep an engine from attaching", "[holder][server][limits]") {
  constexpr int kIdle = 1000;  // the holder's default --max-connections
  if (!HaveOpenFiles(kIdle + 100)) return;
  TempDir dir;
  // An idle limit longer than the test, so that only the connection limit acts.
  HolderProcess h = StartHolder(dir, "h", {"--model", test::TestData(kModel), "--idle-timeout-ms", "600000"});
  REQUIRE(h.WaitReady());
  const Fingerprint fp = test::EngineFingerprint(test::TestData(kModel));

  std::vector<Channel> idle;
  idle.reserve(kIdle);
  uint64_t last_count = 0;
  for (int i = 0; i < kIdle; ++i) {
    Channel ch = Connect(h);
    auto r = ch.Call(EncodeInfoRequest(), 10000);
    REQUIRE(r.ok());
    REQUIRE(r->type() == "info");
    last_count = r->msg["connections"].get<uint64_t>();
    idle.push_back(std::move(ch));
  }
  CHECK(last_count == kIdle);  // the holder is at its limit

  // An engine attaches through the client library, and `wsup cache info`
  // answers; each newcomer makes room by closing the connection idle longest.
  auto a = Attach(Engine(h, "restarted-engine"), fp);
  REQUIRE(a.ok());
  REQUIRE(a->attachment);
  CHECK(a->outcome.source == WeightSource::kHolder);
  TensorView v = a->attachment->Find("lm_head.weight");
  REQUIRE(v.entry);
  CHECK(Sha256Hex(v.data, v.entry->nbytes) == test::ReadTensorsJson(kModel)["lm_head.weight"].sha256);

  // A connection of our own for questions, so that asking adds none.
  Channel asker = Connect(h);
  auto asked = [&]() -> InfoMsg {
    auto r = asker.Call(EncodeInfoRequest(), 5000);
    REQUIRE(r.ok());
    auto i = DecodeInfo(r->msg);
    REQUIRE(i.ok());
    return *i;
  };
  InfoMsg info = asked();
  CHECK(info.evicted == 2);
  CHECK(info.connections == kIdle);
  CHECK(info.max_connections == kIdle);
  CHECK(info.clients == 1);
  CHECK(info.attaches == 1);
  // Anonymous connections are counted, not listed: one reply per peer
  // listing every peer made a thousand of them stall the holder.
  REQUIRE(info.client_list.size() == 1);
  CHECK(info.client_list[0].name == "restarted-engine");
  CHECK(info.client_list.size() <= kMaxListedClients);

  auto cli = test::Run({test::BinPath("wsup"), "cache", "info", "--socket", h.socket});
  INFO(cli.output);
  CHECK(cli.exit_code == 0);
  CHECK_THAT(cli.output, Catch::Contains("limits       1000 connections"));
  // It made room too, then left.
  CHECK(test::WaitFor(
      [&] {
        InfoMsg i = asked();
        return i.evicted == 3 && i.connections == kIdle - 1;
      },
      10s));

  // The ones closed were the three idle longest, told why; the next one
  // and the engine's connection are open.
  for (int i = 0; i < 3; ++i) {
    INFO("idle connection " << i);
    CheckClosedWith(idle[static_cast<size_t>(i)], "unavailable", "--max-connections");
  }
  CHECK(OpenAndQuiet(idle[3].fd()));
  CHECK(OpenAndQuiet(idle[kIdle - 1].fd()));
  CHECK(a->attachment->connected());
  CHECK_THAT(h.Log(), Catch::Contains("the limit (--max-connections); closed"));

  idle.clear();
  a->attachment->Detach();
  StopHolder(h);
}

TEST_CASE("a connection is closed after its idle limit following every request, a keeper keeps its link",
          "[holder][server][limits]") {
  TempDir dir;
  HolderProcess h = StartHolder(dir, "h", {"--model", test::TestData(kModel), "--idle-timeout-ms", "200"});
  REQUIRE(h.WaitReady());
  auto kept = AttachKeeper(h.socket, "keeper", 5000);
  REQUIRE(kept.ok());

  // Two requests: the limit counts after the last one too, not only before
  // the first.
  Channel asker = Connect(h);
  REQUIRE(asker.Call(EncodeInfoRequest(), 5000).ok());
  REQUIRE(asker.Call(EncodeInfoRequest(), 5000).ok());
  auto engine = Attach(Engine(h, "idle-engine"), test::EngineFingerprint(test::TestData(kModel)));
  REQUIRE(engine.ok());
  REQUIRE(engine->attachment);

  CheckClosedWith(asker, "timeout", "200 ms without a request");
  // The engine's connection goes the same way; what it mapped stays.
  auto engine_closed = [&] {
    auto i = QueryHolderInfo(h.socket, 5000);
    if (!i.ok()) return false;
    for (const ClientEntry& e : i->client_list) {
      if (e.name == "idle-engine") return false;
    }
    return true;
  };
  REQUIRE(test::WaitFor(engine_closed, 10s));
  TensorView v = engine->attachment->Find("lm_head.weight");
  REQUIRE(v.entry);
  CHECK(Sha256Hex(v.data, v.entry->nbytes) == test::ReadTensorsJson(kModel)["lm_head.weight"].sha256);

  // The keeper, idle longer than both, still has its link.
  CHECK(OpenAndQuiet(kept->channel.fd()));
  auto info = QueryHolderInfo(h.socket, 5000);
  REQUIRE(info.ok());
  CHECK(info->clients == 1);
  CHECK(info->closed_idle >= 2);
  CHECK(info->idle_timeout_ms == 200);
  CHECK_THAT(h.Log(), Catch::Contains("no request for 200 ms, its idle limit; closed it"));

  // The engine's detach on a connection the holder closed is harmless.
  engine->attachment->Detach();
  kept->channel.Close();
  StopHolder(h);
}

TEST_CASE("at the connection limit an idle connection makes room, never one with a request in flight",
          "[holder][server][limits]") {
  TempDir dir;
  // A long request deadline: the half-sent requests must outlive the test.
  HolderProcess h = StartHolder(dir, "h", {"--model", test::TestData(kModel), "--max-connections", "3",
                                           "--handshake-timeout-ms", "60000"});
  REQUIRE(h.WaitReady());
  const Fingerprint fp = test::EngineFingerprint(test::TestData(kModel));

  SECTION("the longest idle goes, the oldest busy one stays") {
    Channel busy = Connect(h);  // the oldest connection, with half a request
    SplitHello hello = KeeperHelloInTwo("busy");
    SendRaw(busy.fd(), hello.head);
    REQUIRE(HolderReadAll(busy.fd()));
    Channel first = Connect(h);
    REQUIRE(first.Call(EncodeInfoRequest(), 5000).ok());
    Channel second = Connect(h);
    REQUIRE(second.Call(EncodeInfoRequest(), 5000).ok());

    auto a = Attach(Engine(h, "newcomer"), fp);
    REQUIRE(a.ok());
    REQUIRE(a->attachment);
    CheckClosedWith(first, "unavailable", "3 connections open, its limit (--max-connections)");
    CHECK(OpenAndQuiet(second.fd()));

    // The busy connection finishes its request and is served.
    SendRaw(busy.fd(), hello.tail);
    auto r = busy.Receive(5000);
    REQUIRE(r.ok());
    CHECK(r->type() == "attach");
    CHECK(r->fds.size() == 1);
    a->attachment->Detach();
  }
  SECTION("when every connection has a request in flight the newcomer is told the limit and the fix") {
    std::vector<Channel> busy;
    std::vector<SplitHello> hellos;
    for (int i = 0; i < 3; ++i) {
      busy.push_back(Connect(h));
      hellos.push_back(KeeperHelloInTwo("busy-" + std::to_string(i)));
      SendRaw(busy.back().fd(), hellos.back().head);
      REQUIRE(HolderReadAll(busy.back().fd()));
    }
    auto refused = Attach(Engine(h, "newcomer"), fp);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().code() == Code::kUnavailable);
    CHECK_THAT(refused.error().message(),
               Catch::Contains("3 connections open, its limit (wsup-holder --max-connections 3)") &&
                   Catch::Contains("every one has a request in flight") &&
                   Catch::Contains("raise --max-connections"));
    CHECK_THAT(h.Log(), Catch::Contains("every one has a request in flight"));

    // None of them was closed: each finishes its request and is served.
    for (size_t i = 0; i < busy.size(); ++i) {
      SendRaw(busy[i].fd(), hellos[i].tail);
      auto r = busy[i].Receive(5000);
      REQUIRE(r.ok());
      CHECK(r->type() == "attach");
    }
    // Now idle, they make room again (three attached keepers: the one idle
    // longest goes, since no other connection is idle).
    auto a = Attach(Engine(h, "newcomer"), fp);
    REQUIRE(a.ok());
    REQUIRE(a->attachment);
    CheckClosedWith(busy[0], "unavailable", "--max-connections");
    CHECK(OpenAndQuiet(busy[1].fd()));
    CHECK_THAT(h.Log(), Catch::Contains("a keeper: no other connection was idle"));
    a->attachment->Detach();
  }
  StopHolder(h);
}

TEST_CASE("wsup-holder refuses limits that are not positive", "[holder][server][limits]") {
  TempDir dir;
  for (const auto& [flag, says] : std::vector<std::pair<std::string, std::string>>{
           {"--idle-timeout-ms", "--idle-timeout-ms 0: must be positive"},
           {"--max-connections", "--max-connections 0: must be 1 or more"}}) {
    auto r = test::Run({test::BinPath("wsup-holder"), "--socket", dir.Join("h.sock"), "--model",
                        test::TestData(kModel), flag, "0"},
                       30s);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(says));
  }
}

}  // namespace
}  // namespace wsup
