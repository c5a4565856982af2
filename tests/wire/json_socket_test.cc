// The one JSON socket (wire/json_socket.h) from outside: a JsonServer on a
// loop thread, real Unix-socket clients on the test thread, among them the
// blocking ones: JsonCall, Channel's connect and the tests' ControlClient.
#include "wire/json_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>
#include <optional>

#include "common/unique_fd.h"
#include "testkit/control_client.h"
#include "testkit/loop_thread.h"
#include "testkit/test_util.h"
#include "wire/json_call.h"
#include "wire/json_frame.h"
#include "wire/protocol.h"

using nlohmann::json;
using namespace std::chrono_literals;

namespace wsup {
namespace {

using test::LoopThread;

// A blocking client with a receive timeout, so no read can hang the test.
UniqueFd Dial(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  timeval tv{10, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    REQUIRE(n > 0);
    off += static_cast<size_t>(n);
  }
}

std::string Le32(uint32_t n) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// The next message, or nullopt at EOF (a timeout fails the test).
std::optional<json> ReadMessage(int fd, FrameDecoder& d) {
  for (;;) {
    auto m = d.Next();
    REQUIRE(m.ok());
    if (m->has_value()) return **m;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    REQUIRE(n >= 0);  // -1: the 10 s receive timeout passed
    if (n == 0) return std::nullopt;
    REQUIRE(d.Feed(buf, static_cast<size_t>(n)).ok());
  }
}

// An echo server: {"n":N} -> {"echo":N}; {"type":"close"} closes the
// connection after its reply.
struct EchoServer {
  EchoServer(LoopThread& lt, const std::string& path, JsonServerOptions o) : lt(lt) {
    lt.Do([&] {
      server = std::make_unique<JsonServer>(
          lt.loop(), path,
          [](const std::shared_ptr<JsonConn>& c, const json& m) {
            if (m.value("type", "") == "flood") {
              // Up to 64 MiB: far past any kernel buffer, so only the
              // queue bound can stop it.
              std::string pad(16 * 1024, 'x');
              for (int i = 0; i < 4096 && c->alive(); ++i) c->Send(json{{"event", i}, {"pad", pad}});
              return;
            }
            if (m.value("type", "") == "close") {
              c->SendAndClose(json{{"bye", true}}, "asked");
              return;
            }
            if (m.value("type", "") == "eventful") {
              // Events pushed to the client before its reply, as the
              // front broadcasts them.
              c->Send(json{{"type", "event"}, {"kind", "backend_down"}});
              c->Send(json{{"type", "event"}, {"kind", "first_ok"}});
            }
            c->Send(json{{"echo", m.value("n", -1)}});
          },
          std::move(o));
      listened = server->Listen();
    });
  }
  ~EchoServer() { Stop(); }
  void Stop() {
    if (!server) return;
    bool closed = false;
    lt.Do([&] { server->Close([&] { closed = true; }); });
    CHECK(test::WaitFor(
        [&] {
          bool c = false;
          lt.Do([&] { c = closed; });
          return c;
        },
        10s));
    lt.Do([&] { server.reset(); });
  }
  size_t Clients() {
    size_t n = 0;
    lt.Do([&] { n = server->client_count(); });
    return n;
  }
  LoopThread& lt;
  std::unique_ptr<JsonServer> server;
  Status listened;
};

JsonServerOptions Answering() {
  JsonServerOptions o;
  o.conn.frames = FrameDialect{.max_bytes = 1024, .check_ahead = true, .code = Code::kInvalidArgument};
  o.conn.answer_bad_messages = true;
  return o;
}

// An echo server on a socket in a folder of its own, on its own loop thread.
struct EchoRig {
  explicit EchoRig(JsonServerOptions o = {}) : s(lt, path, std::move(o)) { REQUIRE(s.listened.ok()); }
  test::TempDir dir;
  std::string path = dir.Join("s.sock");
  LoopThread lt;
  EchoServer s;
};

TEST_CASE("json socket: replies in order, socket mode 0600, the file removed on close", "[wire]") {
  EchoRig rig;
  struct stat st{};
  REQUIRE(::stat(rig.path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  auto r = JsonCall(rig.path, json{{"n", 7}}, 5000);
  REQUIRE(r.ok());
  CHECK((*r)["echo"] == 7);
  // Events that come before the reply are not the reply.
  auto past_events = JsonCall(rig.path, json{{"type", "eventful"}, {"n", 8}}, 5000);
  REQUIRE(past_events.ok());
  CHECK((*past_events)["echo"] == 8);

  // Three frames in one write, answered one by one and in order.
  UniqueFd fd = Dial(rig.path);
  SendAll(fd.get(), EncodeFrame(json{{"n", 1}}).value() + EncodeFrame(json{{"n", 2}}).value() +
                        EncodeFrame(json{{"type", "close"}}).value());
  FrameDecoder d;
  for (int want : {1, 2}) {
    auto m = ReadMessage(fd.get(), d);
    REQUIRE(m);
    CHECK((*m)["echo"] == want);
  }
  auto bye = ReadMessage(fd.get(), d);
  REQUIRE(bye);
  CHECK((*bye)["bye"] == true);
  CHECK_FALSE(ReadMessage(fd.get(), d));  // closed after the last reply
  CHECK(test::WaitFor([&] { return rig.s.Clients() == 0; }, 10s));
  rig.s.Stop();
  CHECK(::access(rig.path.c_str(), F_OK) != 0);
}

TEST_CASE("json socket: a stale socket file is replaced, a live one or a plain file refused", "[wire]") {
  test::TempDir dir;
  LoopThread lt;
  SECTION("stale") {
    std::string path = dir.Join("stale.sock");
    {
      UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
      sockaddr_un sa{};
      sa.sun_family = AF_UNIX;
      std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
      REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    }  // closed without unlink: nobody listens there
    EchoServer s(lt, path, JsonServerOptions{});
    REQUIRE(s.listened.ok());
    CHECK(JsonCall(path, json{{"n", 1}}, 5000).ok());
  }
  SECTION("live") {
    std::string path = dir.Join("live.sock");
    EchoServer first(lt, path, JsonServerOptions{});
    REQUIRE(first.listened.ok());
    JsonServerOptions o;
    o.words.in_use = "{path} is taken; pass --other";
    EchoServer second(lt, path, o);
    REQUIRE_FALSE(second.listened.ok());
    CHECK(second.listened.error().message() == path + " is taken; pass --other");
    second.server.reset();
    // The first still serves: the refused one did not take its file.
    CHECK(JsonCall(path, json{{"n", 3}}, 5000).ok());
  }
  SECTION("plain file") {
    std::string path = dir.Join("file");
    std::ofstream(path) << "x";
    EchoServer s(lt, path, JsonServerOptions{});
    REQUIRE_FALSE(s.listened.ok());
    CHECK(s.listened.error().message().find("exists and is not a socket") != std::string::npos);
    s.server.reset();
    CHECK(test::ReadAll(path) == "x");  // never removed
  }
  SECTION("path too long") {
    JsonServerOptions o;
    o.words.path_too_long = "'{path}' is longer than {max} bytes";
    std::string path = dir.Join(std::string(200, 'p'));
    EchoServer s(lt, path, o);
    REQUIRE_FALSE(s.listened.ok());
    CHECK(s.listened.error().message().find("is longer than 107 bytes") != std::string::npos);
    s.server.reset();
  }
}

TEST_CASE("json socket: a bad body is answered and the client kept, a bad prefix answered, then dropped", "[wire]") {
  EchoRig rig(Answering());
  UniqueFd fd = Dial(rig.path);
  FrameDecoder d;
  SendAll(fd.get(), Le32(8) + "not json");
  auto err = ReadMessage(fd.get(), d);
  REQUIRE(err);
  CHECK((*err)["type"] == "error");
  CHECK((*err)["message"].get<std::string>().find("not valid JSON") != std::string::npos);
  std::string deep = std::string(100, '[') + std::string(100, ']');
  SendAll(fd.get(), Le32(static_cast<uint32_t>(deep.size())) + deep);
  err = ReadMessage(fd.get(), d);
  REQUIRE(err);
  CHECK((*err)["type"] == "error");
  // Still served; then a good frame and a hostile prefix in one write: the
  // good one is answered first, then the refusal, then EOF.
  SendAll(fd.get(), EncodeFrame(json{{"n", 5}}).value() + Le32(1u << 30));
  auto good = ReadMessage(fd.get(), d);
  REQUIRE(good);
  CHECK((*good)["echo"] == 5);
  auto refusal = ReadMessage(fd.get(), d);
  REQUIRE(refusal);
  CHECK((*refusal)["message"].get<std::string>().find("1073741824") != std::string::npos);
  CHECK_FALSE(ReadMessage(fd.get(), d));
}

TEST_CASE("json socket: without answering, a bad message closes the connection at once", "[wire]") {
  EchoRig rig;
  UniqueFd fd = Dial(rig.path);
  SendAll(fd.get(), Le32(5) + "[1,2]");
  FrameDecoder d;
  CHECK_FALSE(ReadMessage(fd.get(), d));
  CHECK(test::WaitFor([&] { return rig.s.Clients() == 0; }, 10s));
}

TEST_CASE("json socket: past max_clients a client is told why and closed, the others stay", "[wire]") {
  JsonServerOptions o;
  o.max_clients = 2;
  o.words.too_many_clients = "too many on {path}";
  EchoRig rig(o);
  UniqueFd a = Dial(rig.path), b = Dial(rig.path);
  REQUIRE(test::WaitFor([&] { return rig.s.Clients() == 2; }, 10s));
  UniqueFd c = Dial(rig.path);
  FrameDecoder dc;
  auto refusal = ReadMessage(c.get(), dc);
  REQUIRE(refusal);
  CHECK((*refusal)["message"] == "too many on " + rig.path);
  CHECK_FALSE(ReadMessage(c.get(), dc));
  SendAll(a.get(), EncodeFrame(json{{"n", 1}}).value());
  FrameDecoder da;
  auto m = ReadMessage(a.get(), da);
  REQUIRE(m);
  CHECK((*m)["echo"] == 1);
  // Room again once one leaves.
  b.Reset();
  REQUIRE(test::WaitFor([&] { return rig.s.Clients() == 1; }, 10s));
  CHECK(JsonCall(rig.path, json{{"n", 2}}, 5000).ok());
}

TEST_CASE("json socket: a client that reads nothing is dropped at max_queued_bytes, the others stay", "[wire]") {
  JsonServerOptions o;
  o.conn.max_queued_bytes = 256 * 1024;
  EchoRig rig(o);
  UniqueFd other = Dial(rig.path);
  UniqueFd deaf = Dial(rig.path);
  REQUIRE(test::WaitFor([&] { return rig.s.Clients() == 2; }, 10s));
  SendAll(deaf.get(), EncodeFrame(json{{"type", "flood"}}).value());
  CHECK(test::WaitFor([&] { return rig.s.Clients() == 1; }, 10s));
  // It gets what was written before the bound, then EOF, far short of 4096.
  FrameDecoder d(1u << 20);
  int got = 0;
  while (ReadMessage(deaf.get(), d)) ++got;
  CHECK(got > 0);
  CHECK(got < 4096);
  SendAll(other.get(), EncodeFrame(json{{"n", 9}}).value());
  FrameDecoder od;
  auto m = ReadMessage(other.get(), od);
  REQUIRE(m);
  CHECK((*m)["echo"] == 9);
}

// A socket file that nobody accepts on (connect says ECONNREFUSED): what a
// process leaves behind when it exits without removing its socket.
void LeaveDeadSocket(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
  REQUIRE(fd.valid());
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
}

TEST_CASE("channel: connecting where nothing listens names the socket's peer, not the holder", "[wire]") {
  test::TempDir dir;
  // The supervisor's control socket, never made (ENOENT).
  const std::string sup = dir.Join("wsup.sock");
  auto none = Channel::Connect(sup, 2000, {"the supervisor", "start the node: wsup start CONFIG"});
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().code() == Code::kUnavailable);
  CHECK_THAT(none.error().message(),
             Catch::StartsWith(sup + ": the supervisor is not listening there (") &&
                 Catch::EndsWith("); start the node: wsup start CONFIG, or check the path"));
  CHECK_THAT(none.error().message(), !Catch::Contains("holder"));

  // The front's control socket, left by a front that exited (ECONNREFUSED).
  const std::string front = dir.Join("front.sock");
  LeaveDeadSocket(front);
  const SocketPeer front_peer{"the front", "the supervisor starts it: check the supervisor's log"};
  auto dead = Channel::Connect(front, 2000, front_peer);
  REQUIRE_FALSE(dead.ok());
  CHECK(dead.error().code() == Code::kUnavailable);
  CHECK_THAT(dead.error().message(),
             Catch::StartsWith(front + ": the front is not listening there (") &&
                 Catch::Contains("; the supervisor starts it: check the supervisor's log") &&
                 !Catch::Contains("holder"));

  auto unnamed = Channel::Connect("", 2000, front_peer);
  REQUIRE_FALSE(unnamed.ok());
  CHECK(unnamed.error().code() == Code::kInvalidArgument);
  CHECK(unnamed.error().message() == "no socket path given for the front; pass the path it listens on");

  // Told nothing, the peer is the holder, as for every holder client.
  auto holder = Channel::Connect(sup, 2000);
  REQUIRE_FALSE(holder.ok());
  CHECK_THAT(holder.error().message(),
             Catch::StartsWith(sup + ": the holder is not listening there (") &&
                 Catch::EndsWith("); start wsup-holder with this --socket, or check the path"));

  // The tests' control client names both the socket and who should be there.
  test::ControlClient ctl;
  Status s = ctl.Connect(front);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == Code::kUnavailable);
  CHECK_THAT(s.error().message(),
             Catch::StartsWith(front + ": the supervisor or the front is not listening there (") &&
                 !Catch::Contains("holder"));
  CHECK_FALSE(ctl.connected());
}

TEST_CASE("control client: replies, events kept apart, raw bytes, the peer's close and a new connection",
          "[wire]") {
  test::TempDir dir;
  std::string path = dir.Join("s.sock");
  LoopThread lt;
  auto s = std::make_unique<EchoServer>(lt, path, Answering());
  REQUIRE(s->listened.ok());

  test::ControlClient c;
  REQUIRE(c.Connect(path));
  auto r = c.Call(json{{"n", 7}});
  REQUIRE(r.ok());
  CHECK((*r)["echo"] == 7);
  // Events before the reply are kept, not taken for it.
  r = c.Call(json{{"type", "eventful"}, {"n", 8}});
  REQUIRE(r.ok());
  CHECK((*r)["echo"] == 8);
  REQUIRE(c.events().size() == 2);
  auto first_ok = c.WaitEvent("first_ok", "", "", 100ms);
  REQUIRE(first_ok.ok());
  CHECK((*first_ok)["kind"] == "first_ok");
  CHECK(c.TakeEvents().size() == 2);
  CHECK(c.events().empty());

  // Raw bytes go as they are: a frame made by hand is answered like Send's.
  std::string body = json{{"n", 9}}.dump();
  REQUIRE(c.SendRaw(Le32(static_cast<uint32_t>(body.size())) + body));
  r = c.Reply();
  REQUIRE(r.ok());
  CHECK((*r)["echo"] == 9);
  // A hostile prefix: answered, then the connection is closed.
  REQUIRE(c.SendRaw(Le32(1u << 30)));
  r = c.Reply();
  REQUIRE(r.ok());
  CHECK((*r)["type"] == "error");
  CHECK(c.WaitClosed());
  // Nothing more comes, and the wait for it is bounded.
  auto after = c.Reply(100ms);
  REQUIRE_FALSE(after.ok());
  CHECK_THAT(after.error().message(), Catch::Contains("the peer closed the connection"));
  // A call on the closed connection fails and closes it; the next connects again.
  CHECK_FALSE(c.Call(json{{"n", 10}}).ok());
  r = c.Call(json{{"n", 11}});
  REQUIRE(r.ok());
  CHECK((*r)["echo"] == 11);

  // The server goes away: its connections close and its file is removed.
  s.reset();
  CHECK(c.WaitClosed());
  CHECK_FALSE(c.Call(json{{"n", 12}}).ok());  // on the closed connection
  auto gone = c.Call(json{{"n", 13}});        // and then connecting again
  REQUIRE_FALSE(gone.ok());
  CHECK(gone.error().code() == Code::kUnavailable);
  CHECK_THAT(gone.error().message(),
             Catch::StartsWith(path + ": the supervisor or the front is not listening"));
}

}  // namespace
}  // namespace wsup
