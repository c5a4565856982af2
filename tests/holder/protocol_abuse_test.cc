// Protocol abuse against a real wsup-holder: each misbehaving client is
// dropped with a log line, and a well-behaved client is served after each.

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "client/client.h"
#include "tests/holder/holder_fixture.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using test::HolderProcess, test::StartHolder, test::TempDir;

const std::string kModel = "llama-tiny-f32";

std::string Frame32(uint32_t len, const std::string& body) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  return s + body;
}

void SendRaw(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Reads until EOF (bounded); returns what arrived, or nullopt on timeout.
std::optional<std::string> ReadUntilEof(int fd, std::chrono::milliseconds limit) {
  std::string got;
  bool eof = test::WaitFor(
      [&] {
        char buf[4096];
        ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) got.append(buf, static_cast<size_t>(n));
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
      },
      limit);
  if (!eof) return std::nullopt;
  return got;
}

// The body of the first frame in `bytes`, parsed.
nlohmann::json FirstMessage(const std::string& bytes) {
  FrameDecoder d;
  REQUIRE(d.Feed(bytes.data(), bytes.size()).ok());
  auto m = d.Next();
  REQUIRE(m.ok());
  REQUIRE(m->has_value());
  return **m;
}

void CheckWellBehavedClientIsServed(const HolderProcess& h) {
  auto info = QueryHolderInfo(h.socket, 5000);
  REQUIRE(info.ok());
  AttachOptions o;
  o.socket_path = h.socket;
  o.client_name = "well-behaved";
  auto a = Attach(o, test::EngineFingerprint(test::TestData(kModel)));
  REQUIRE(a.ok());
  REQUIRE(a->attachment);
  CHECK(a->attachment->size() == 21);
}

Channel Connect(const HolderProcess& h) {
  auto ch = Channel::Connect(h.socket, 5000);
  REQUIRE(ch.ok());
  return std::move(ch).value();
}

TEST_CASE("garbage, oversized prefixes, mid-message disconnects and silence are dropped, others are served",
          "[holder][server][abuse]") {
  TempDir dir;
  HolderProcess h =
      StartHolder(dir, "h", {"--model", test::TestData(kModel), "--handshake-timeout-ms", "300"});
  REQUIRE(h.WaitReady());

  SECTION("an HTTP request instead of a frame") {
    Channel ch = Connect(h);
    SendRaw(ch.fd(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    auto got = ReadUntilEof(ch.fd(), 5s);
    REQUIRE(got);
    CHECK(FirstMessage(*got)["type"] == "error");
    CHECK(test::WaitFor([&] { return h.Log().find("sent a bad message") != std::string::npos; }, 5s));
  }
  SECTION("a frame whose body is not JSON") {
    Channel ch = Connect(h);
    SendRaw(ch.fd(), Frame32(10, "not json!!"));
    auto got = ReadUntilEof(ch.fd(), 5s);
    REQUIRE(got);
    auto m = FirstMessage(*got);
    CHECK(m["type"] == "error");
    CHECK_THAT(m["message"].get<std::string>(), Catch::Contains("not valid JSON"));
  }
  SECTION("a JSON array, a deeply nested object, and an unknown type") {
    for (std::string body : {std::string("[1,2,3]"), std::string(10000, '[') + std::string(10000, ']'),
                             std::string(R"({"type":"shutdown"})"), std::string(R"({"type":7})")}) {
      Channel ch = Connect(h);
      SendRaw(ch.fd(), Frame32(static_cast<uint32_t>(body.size()), body));
      auto got = ReadUntilEof(ch.fd(), 5s);
      REQUIRE(got);
      CHECK(FirstMessage(*got)["type"] == "error");
    }
  }
  SECTION("an oversized length prefix is refused before any body arrives") {
    Channel ch = Connect(h);
    SendRaw(ch.fd(), Frame32(0xffffffffu, ""));
    auto got = ReadUntilEof(ch.fd(), 5s);
    REQUIRE(got);
    auto m = FirstMessage(*got);
    CHECK_THAT(m["message"].get<std::string>(), Catch::Contains("4294967295 bytes"));
    CHECK(test::WaitFor([&] { return h.Log().find("more than the 1048576 allowed") != std::string::npos; }, 5s));
  }
  SECTION("a zero length prefix") {
    Channel ch = Connect(h);
    SendRaw(ch.fd(), Frame32(0, ""));
    auto got = ReadUntilEof(ch.fd(), 5s);
    REQUIRE(got);
    CHECK(FirstMessage(*got)["type"] == "error");
  }
  SECTION("a disconnect in the middle of the hello") {
    {
      Channel ch = Connect(h);
      SendRaw(ch.fd(), Frame32(100, "{\"type\":\"he"));
    }
    CHECK(test::WaitFor(
        [&] { return h.Log().find("disconnected in the middle of a message (15 bytes received of 104)") !=
                     std::string::npos; },
        5s));
  }
  SECTION("a client that sends nothing is dropped after the time limit") {
    Channel ch = Connect(h);
    auto got = ReadUntilEof(ch.fd(), 10s);
    REQUIRE(got);
    auto m = FirstMessage(*got);
    CHECK(m["code"] == "timeout");
    CHECK_THAT(m["message"].get<std::string>(), Catch::Contains("300 ms"));
    CHECK_THAT(h.Log(), Catch::Contains("sent no complete request within 300 ms"));
  }
  SECTION("a client that sends half a hello is dropped after the time limit") {
    Channel ch = Connect(h);
    SendRaw(ch.fd(), Frame32(60, "{\"type\":"));
    REQUIRE(ReadUntilEof(ch.fd(), 10s));
    CHECK_THAT(h.Log(), Catch::Contains("(12 bytes received)"));
  }
  SECTION("fds pushed at the holder are refused") {
    Channel ch = Connect(h);
    std::vector<UniqueFd> fds;
    fds.emplace_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    REQUIRE(ch.Send(EncodeInfoRequest(), std::move(fds), 5000).ok());
    auto reply = ch.Receive(5000);
    REQUIRE(reply.ok());
    CHECK(reply->type() == "error");
    CHECK_THAT(reply->msg["message"].get<std::string>(), Catch::Contains("accepts none"));
  }
  SECTION("a second hello, a wrong version, an engine without a fingerprint, a bad role") {
    {
      Channel ch = Connect(h);
      HelloMsg hello{kProtocolVersion, "twice", ClientRole::kKeeper, std::nullopt};
      auto first = ch.Call(EncodeHello(hello), 5000);
      REQUIRE(first.ok());
      CHECK(first->type() == "attach");
      auto second = ch.Call(EncodeHello(hello), 5000);
      REQUIRE(second.ok());
      CHECK(second->type() == "error");
    }
    {
      Channel ch = Connect(h);
      HelloMsg hello{kProtocolVersion + 1, "future", ClientRole::kKeeper, std::nullopt};
      auto r = ch.Call(EncodeHello(hello), 5000);
      REQUIRE(r.ok());
      CHECK(r->type() == "error");
      CHECK_THAT(r->msg["message"].get<std::string>(), Catch::Contains("protocol version 1"));
    }
    {
      Channel ch = Connect(h);
      HelloMsg hello{kProtocolVersion, "no-fp", ClientRole::kEngine, std::nullopt};
      auto r = ch.Call(EncodeHello(hello), 5000);
      REQUIRE(r.ok());
      CHECK(r->type() == "error");
      CHECK_THAT(r->msg["message"].get<std::string>(), Catch::Contains("must present the fingerprint"));
    }
    {
      Channel ch = Connect(h);
      auto r = ch.Call({{"type", "hello"}, {"version", 1}, {"client", "x"}, {"role", "root"}}, 5000);
      REQUIRE(r.ok());
      CHECK(r->type() == "error");
      CHECK_THAT(r->msg["message"].get<std::string>(), Catch::Contains("role"));
    }
  }
  CheckWellBehavedClientIsServed(h);
  CHECK(h.child.running());
}

// Apart from the test above: its holder drops a client that takes none of a
// reply within 300 ms, which a test process descheduled on a loaded machine
// (the sanitizer build, tests in parallel) can miss while it reads 2,000
// replies. Here the reply deadline is the default's order.
TEST_CASE("pipelined requests are answered in order, and a client that never reads holds up no one",
          "[holder][server][abuse]") {
  TempDir dir;
  HolderProcess h =
      StartHolder(dir, "h", {"--model", test::TestData(kModel), "--handshake-timeout-ms", "10000"});
  REQUIRE(h.WaitReady());
  SECTION("pipelined requests are all answered, in order") {
    Channel ch = Connect(h);
    auto one = EncodeFrame(EncodeInfoRequest());
    REQUIRE(one.ok());
    std::string many;
    for (int i = 0; i < 2000; ++i) many += *one;
    SendRaw(ch.fd(), many);
    for (int i = 0; i < 2000; ++i) {
      auto r = ch.Receive(5000);
      if (!r.ok()) FAIL("reply " << i << ": " << r.error().message() << "\nholder log:\n" << h.Log());
      REQUIRE(r->type() == "info");
    }
  }
  SECTION("a client that never reads its replies does not hold up anyone else") {
    Channel ch = Connect(h);
    auto one = EncodeFrame(EncodeInfoRequest());
    REQUIRE(one.ok());
    std::string many;
    for (int i = 0; i < 20000; ++i) many += *one;
    ::fcntl(ch.fd(), F_SETFL, O_NONBLOCK);
    SendRaw(ch.fd(), many);  // stops when the holder stops reading
    CheckWellBehavedClientIsServed(h);
  }
  CheckWellBehavedClientIsServed(h);
  CHECK(h.child.running());
}

TEST_CASE("a slow client does not block a fast one", "[holder][server][abuse]") {
  TempDir dir;
  HolderProcess h = StartHolder(dir, "h", {"--model", test::TestData(kModel)});  // 10 s limit
  REQUIRE(h.WaitReady());
  Channel slow = Connect(h);
  SendRaw(slow.fd(), Frame32(200, "{\"type\":\"hello\","));
  Channel silent = Connect(h);
  CheckWellBehavedClientIsServed(h);
  auto info = QueryHolderInfo(h.socket, 5000);
  REQUIRE(info.ok());
  CHECK(info->connections >= 3);  // the slow, the silent, and this one
  // The slow client can still finish its hello and be served.
  std::string rest = R"("version":1,"client":"slow","role":"keeper"})";
  std::string body = "{\"type\":\"hello\"," + rest;
  body.resize(200, ' ');
  SendRaw(slow.fd(), body.substr(16));
  auto r = slow.Receive(5000);
  REQUIRE(r.ok());
  CHECK(r->type() == "attach");
  CHECK(r->fds.size() == 1);
}

TEST_CASE("200 clients at once", "[holder][server][abuse]") {
  TempDir dir;
  HolderProcess h = StartHolder(dir, "h", {"--model", test::TestData(kModel)});
  REQUIRE(h.WaitReady());
  Fingerprint fp = test::EngineFingerprint(test::TestData(kModel));
  std::vector<Channel> chans;
  for (int i = 0; i < 200; ++i) chans.push_back(Connect(h));
  for (int i = 0; i < 200; ++i) {
    std::string name = "c";  // appended, not `"c" + ...`: GCC 12 -O3 gives a false -Wrestrict error on that
    name += std::to_string(i);
    nlohmann::json msg =
        i % 2 == 0 ? EncodeHello(HelloMsg{kProtocolVersion, name, ClientRole::kEngine, fp}) : EncodeInfoRequest();
    REQUIRE(chans[static_cast<size_t>(i)].Send(msg, {}, 5000).ok());
  }
  for (int i = 0; i < 200; ++i) {
    auto r = chans[static_cast<size_t>(i)].Receive(10000);
    REQUIRE(r.ok());
    CHECK(r->type() == (i % 2 == 0 ? "attach" : "info"));
    if (i % 2 == 0) CHECK(r->fds.size() == 1);
  }
  auto info = QueryHolderInfo(h.socket, 5000);
  REQUIRE(info.ok());
  CHECK(info->clients == 100);
  CHECK(info->connections == 201);
  chans.clear();
  CHECK(test::WaitFor(
      [&] {
        auto i = QueryHolderInfo(h.socket, 5000);
        return i.ok() && i->connections == 1;
      },
      10s));
  CheckWellBehavedClientIsServed(h);
}

// Runs fn in a child process as uid/gid 65534 and returns its exit code.
int AsNobody(const std::function<int()>& fn) { return test::RunForkedAs(65534, fn, 10s); }

// 0: connect failed with EACCES; 1: connected and got an error frame, then
// EOF; 2: anything else.
int ConnectAsStranger(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return errno == EACCES ? 0 : 2;
  std::string got;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  for (int i = 0; i < 100 && ::poll(&p, 1, 100) >= 0; ++i) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got.find("\"type\":\"error\"") != std::string::npos && got.find("uid 65534") != std::string::npos ? 1 : 2;
}

TEST_CASE("a client of another uid is refused", "[holder][server][abuse]") {
  if (::geteuid() != 0) {
    WARN("SKIP: needs root to switch a child process to another uid");
    return;
  }
  TempDir dir;
  HolderProcess h = StartHolder(dir, "h", {"--model", test::TestData(kModel)});
  REQUIRE(h.WaitReady());
  // The private directory stops it at connect().
  CHECK(AsNobody([&] { return ConnectAsStranger(h.socket); }) == 0);
  CheckWellBehavedClientIsServed(h);

  // With the directory and socket opened up by mistake, the peer-uid check
  // still refuses it, and says so in the log.
  REQUIRE(::chmod(dir.path().c_str(), 0711) == 0);
  REQUIRE(::chmod(h.socket.c_str(), 0666) == 0);
  CHECK(AsNobody([&] { return ConnectAsStranger(h.socket); }) == 1);
  CHECK(test::WaitFor([&] { return h.Log().find("uid 65534") != std::string::npos; }, 5s));
  CHECK_THAT(h.Log(), Catch::Contains("refused a connection from pid"));
  CheckWellBehavedClientIsServed(h);
}

TEST_CASE("a world-accessible or foreign socket directory is refused at start", "[holder][server][abuse]") {
  TempDir dir;
  std::string open_dir = dir.Join("open");
  REQUIRE(::mkdir(open_dir.c_str(), 0777) == 0);
  REQUIRE(::chmod(open_dir.c_str(), 0777) == 0);
  auto r = test::Run({test::BinPath("wsup-holder"), "--socket", open_dir + "/h.sock", "--model",
                      test::TestData(kModel)},
                     30s);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("mode 0777") && Catch::Contains("chmod 700 " + open_dir));

  if (::geteuid() == 0) {
    std::string foreign = dir.Join("foreign");
    REQUIRE(::mkdir(foreign.c_str(), 0700) == 0);
    REQUIRE(::chown(foreign.c_str(), 65534, 65534) == 0);
    auto f = test::Run({test::BinPath("wsup-holder"), "--socket", foreign + "/h.sock", "--model",
                        test::TestData(kModel)},
                       30s);
    CHECK(f.exit_code == 1);
    CHECK_THAT(f.output, Catch::Contains("belongs to uid 65534"));
  }
}

}  // namespace
}  // namespace wsup
