// The holder protocol's pieces (framing, fd passing, message decoding, the
// arena record, socket naming), the client's modes without a holder, and the
// C ABI's argument handling, including the shared library as ctypes loads it.

#include "client/client.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include "client/wsup_client.h"
#include "testkit/test_util.h"
#include "tests/wire/wire_check.h"
#include "wire/protocol.h"

namespace wsup {
namespace {

using nlohmann::json;

std::string Prefix(uint32_t n) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A unix socket listening at path (backlog 8) that nothing accepts on: the
// kernel takes connections into the backlog, and nobody answers.
UniqueFd ListenUnix(const std::string& path) {
  UniqueFd l(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  REQUIRE(::bind(l.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(l.get(), 8) == 0);
  return l;
}

Fingerprint SomeFingerprint() {
  auto fp = Fingerprint::FromJson(json{{"model_path", "/m"}, {"tp_size", "1"}, {"tp_rank", "0"}, {"backend", "host"}});
  REQUIRE(fp.ok());
  return *fp;
}

TEST_CASE("frames round-trip, whole or one byte at a time", "[client][protocol]") {
  json a = {{"type", "info"}};
  json b = {{"type", "hello"}, {"client", "x\xc3\xa9"}, {"list", {1, 2, 3}}};
  auto fa = EncodeFrame(a);
  auto fb = EncodeFrame(b);
  REQUIRE(fa.ok());
  REQUIRE(fb.ok());
  std::string stream = *fa + *fb;
  CHECK(stream.substr(0, 4) == Prefix(static_cast<uint32_t>(fa->size() - 4)));

  FrameDecoder whole;
  REQUIRE(whole.Feed(stream.data(), stream.size()).ok());
  auto m1 = whole.Next();
  auto m2 = whole.Next();
  auto m3 = whole.Next();
  REQUIRE((m1.ok() && m2.ok() && m3.ok()));
  CHECK(**m1 == a);
  CHECK(**m2 == b);
  CHECK_FALSE(m3->has_value());
  CHECK_FALSE(whole.mid_message());

  FrameDecoder bytewise;
  std::vector<json> got;
  for (char c : stream) {
    REQUIRE(bytewise.Feed(&c, 1).ok());
    auto m = bytewise.Next();
    REQUIRE(m.ok());
    if (m->has_value()) got.push_back(**m);
  }
  REQUIRE(got.size() == 2);
  CHECK(got[1] == b);
}

TEST_CASE("the decoder refuses bad frames, and bad prefixes before their body", "[client][protocol]") {
  SECTION("oversized prefix: refused as soon as its 4 bytes are known") {
    FrameDecoder d(1024);
    std::string p = Prefix(1025);
    REQUIRE(d.Feed(p.data(), 3).ok());
    Status s = d.Feed(p.data() + 3, 1);
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == Code::kCorrupt);
    CHECK_THAT(s.error().message(), Catch::Contains("1025 bytes") && Catch::Contains("1024 allowed"));
    CHECK(d.buffered() == 4);  // nothing of a body was taken in
  }
  SECTION("a prefix of exactly the limit is fine") {
    FrameDecoder d(16);
    std::string f = Prefix(16) + R"({"type":"xxxxx"})";
    REQUIRE(d.Feed(f.data(), f.size()).ok());
    auto m = d.Next();
    REQUIRE(m.ok());
    CHECK(m->has_value());
  }
  SECTION("a bad prefix after a good message") {
    FrameDecoder d(64);
    std::string f = Prefix(2) + "{}" + Prefix(100000);
    Status s = d.Feed(f.data(), f.size());
    CHECK(s.ok());  // the first frame is fine; the second is checked when reached
    auto m = d.Next();
    CHECK_FALSE(m.ok());
  }
  SECTION("zero length, not JSON, not an object, too deep") {
    for (std::string body : {std::string(), std::string("nope"), std::string("[1]"), std::string("\"s\""),
                             std::string(100, '[') + std::string(100, ']'),
                             std::string("{\"a\":") + std::string(70, '{') + std::string(71, '}')}) {
      INFO(body.substr(0, 20));
      FrameDecoder d;
      std::string f = Prefix(static_cast<uint32_t>(body.size())) + body;
      Status fed = d.Feed(f.data(), f.size());
      if (!fed.ok()) {
        CHECK(fed.code() == Code::kCorrupt);
        continue;
      }
      auto m = d.Next();
      REQUIRE_FALSE(m.ok());
      CHECK(m.error().code() == Code::kCorrupt);
    }
  }
  SECTION("brackets inside strings do not count as nesting") {
    FrameDecoder d;
    std::string body = "{\"s\":\"" + std::string(500, '[') + "\\\"\"}";
    std::string f = Prefix(static_cast<uint32_t>(body.size())) + body;
    REQUIRE(d.Feed(f.data(), f.size()).ok());
    auto m = d.Next();
    REQUIRE(m.ok());
    REQUIRE(m->has_value());
  }
  SECTION("EncodeFrame refuses a message over the limit") {
    auto f = EncodeFrame(json{{"x", std::string(100, 'a')}}, 50);
    REQUIRE_FALSE(f.ok());
    CHECK_THAT(f.error().message(), Catch::Contains("exceeds"));
  }
}

// Sends `frame` on a and reads one message on b, driving both non-blocking.
Result<Frame> Transfer(OutgoingFrame frame, int a, int b) {
  FrameReader reader(kMaxMessageBytes, true, kMaxBlobBytes);
  for (int i = 0; i < 100000; ++i) {
    if (!frame.done()) {
      auto sent = frame.SendSome(a);
      if (!sent.ok()) return sent.error();
    }
    auto state = reader.ReadSome(b, 1 << 16);
    if (!state.ok()) return state.error();
    auto next = reader.Next();
    if (!next.ok()) return next.error();
    if (next->has_value()) return std::move(**next);
    pollfd p[2] = {{a, POLLOUT, 0}, {b, POLLIN, 0}};
    ::poll(p, 2, 100);
  }
  return Timeout("transfer did not finish");
}

TEST_CASE("more fds than one sendmsg carries arrive complete and in order", "[client][protocol]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd a(sv[0]), b(sv[1]);
  // 300 distinct open files (memfds), so identity can be checked by inode.
  std::vector<UniqueFd> fds;
  std::vector<ino_t> inodes;
  for (int i = 0; i < 300; ++i) {
    UniqueFd fd(::memfd_create("wsup-test", MFD_CLOEXEC));
    REQUIRE(fd.valid());
    struct stat st{};
    REQUIRE(::fstat(fd.get(), &st) == 0);
    inodes.push_back(st.st_ino);
    fds.push_back(std::move(fd));
  }
  auto frame = OutgoingFrame::Make(json{{"type", "attach"}, {"pad", std::string(1000, 'p')}}, std::move(fds));
  REQUIRE(frame.ok());
  auto got = Transfer(std::move(frame).value(), a.get(), b.get());
  REQUIRE(got.ok());
  CHECK(got->msg["fds"] == 300);
  REQUIRE(got->fds.size() == 300);
  for (size_t i = 0; i < 300; ++i) {
    struct stat st{};
    REQUIRE(::fstat(got->fds[i].get(), &st) == 0);
    CHECK(st.st_ino == inodes[i]);
    CHECK((::fcntl(got->fds[i].get(), F_GETFD) & FD_CLOEXEC) != 0);
  }
}

TEST_CASE("a message that announces more fds than arrived is refused", "[client][protocol]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd a(sv[0]), b(sv[1]);
  auto f = EncodeFrame(json{{"type", "attach"}, {"fds", 2}});
  REQUIRE(f.ok());
  REQUIRE(::send(a.get(), f->data(), f->size(), 0) == static_cast<ssize_t>(f->size()));
  FrameReader r(kMaxMessageBytes, true);
  REQUIRE(r.ReadSome(b.get(), 4096).ok());
  auto m = r.Next();
  REQUIRE_FALSE(m.ok());
  CHECK_THAT(m.error().message(), Catch::Contains("announces 2 file descriptors but 0 arrived"));

  FrameReader no_fds(kMaxMessageBytes, false);
  REQUIRE(::send(a.get(), f->data(), f->size(), 0) == static_cast<ssize_t>(f->size()));
  REQUIRE(no_fds.ReadSome(b.get(), 4096).ok());
  auto m2 = no_fds.Next();
  REQUIRE_FALSE(m2.ok());
  CHECK_THAT(m2.error().message(), Catch::Contains("accepts none"));
}

TEST_CASE("a binary part travels after its message, whole or byte by byte, and is bounded",
          "[client][protocol]") {
  std::string blob(3000, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 7);
  json msg = {{"type", "attach"}, {"blob", blob.size()}};
  std::string stream = EncodeFrame(msg).value() + Prefix(static_cast<uint32_t>(blob.size())) + blob +
                       EncodeFrame(json{{"type", "info"}}).value();

  FrameDecoder whole(1024, 4096);
  REQUIRE(whole.Feed(stream.data(), stream.size()).ok());
  auto m1 = whole.NextMessage();
  REQUIRE(m1.ok());
  REQUIRE(m1->has_value());
  CHECK((*m1)->msg["type"] == "attach");
  CHECK((*m1)->blob == blob);
  auto m2 = whole.NextMessage();
  REQUIRE((m2.ok() && m2->has_value()));
  CHECK((*m2)->msg["type"] == "info");
  CHECK((*m2)->blob.empty());

  FrameDecoder bytewise(1024, 4096);
  std::vector<DecodedMessage> got;
  for (char ch : stream) {
    REQUIRE(bytewise.Feed(&ch, 1).ok());
    auto m = bytewise.NextMessage();
    REQUIRE(m.ok());
    if (m->has_value()) {
      got.push_back(std::move(**m));
      if (got.size() == 1) CHECK_FALSE(bytewise.mid_message());
    }
  }
  REQUIRE(got.size() == 2);
  CHECK(got[0].blob == blob);
  CHECK(got[1].msg["type"] == "info");

  SECTION("a frame after the message that is not as long as announced is refused before its body") {
    FrameDecoder d(1024, 4096);
    std::string f = EncodeFrame(msg).value() + Prefix(2999);
    REQUIRE(d.Feed(f.data(), f.size()).ok());
    auto m = d.NextMessage();
    REQUIRE_FALSE(m.ok());
    CHECK_THAT(m.error().message(),
               Catch::Contains("binary part of 3000 bytes but the frame after it holds 2999"));
    CHECK(d.buffered() == 4);
  }
  SECTION("announced sizes out of bounds") {
    for (json bad : {json(0), json(4097), json(-1), json("3000"), json(1ull << 40)}) {
      INFO(bad.dump());
      FrameDecoder d(1024, 4096);
      std::string f = EncodeFrame(json{{"type", "attach"}, {"blob", bad}}).value();
      REQUIRE(d.Feed(f.data(), f.size()).ok());
      auto m = d.NextMessage();
      REQUIRE_FALSE(m.ok());
      CHECK(m.error().code() == Code::kCorrupt);
      CHECK_THAT(m.error().message(), Catch::Contains("this side accepts 1 to 4096"));
    }
  }
  SECTION("a decoder that takes no binary parts ignores the key and refuses the bytes as a message") {
    FrameDecoder d(4096);
    REQUIRE(d.Feed(stream.data(), stream.size()).ok());
    auto m = d.Next();
    REQUIRE((m.ok() && m->has_value()));
    CHECK((**m)["blob"] == 3000);
    auto raw = d.Next();
    REQUIRE_FALSE(raw.ok());
    CHECK_THAT(raw.error().message(), Catch::Contains("not valid JSON"));
  }
  SECTION("the peer hangs up inside the binary part") {
    FrameDecoder d(1024, 4096);
    std::string cut = stream.substr(0, stream.size() - 2000);
    REQUIRE(d.Feed(cut.data(), cut.size()).ok());
    auto m = d.NextMessage();
    REQUIRE(m.ok());
    CHECK_FALSE(m->has_value());
    CHECK(d.mid_message());
  }
}

TEST_CASE("a shared binary part and many fds arrive together over a socket", "[client][protocol]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd a(sv[0]), b(sv[1]);
  std::vector<UniqueFd> fds;
  for (int i = 0; i < 260; ++i) fds.emplace_back(::memfd_create("wsup-test", MFD_CLOEXEC));
  // Larger than a socket buffer, so it goes in several sends.
  auto blob = std::make_shared<const std::string>(3u << 20, 'b');
  auto frame = OutgoingFrame::Make(json{{"type", "attach"}}, std::move(fds), kMaxMessageBytes, blob);
  REQUIRE(frame.ok());
  CHECK(frame->remaining_bytes() > blob->size());
  auto got = Transfer(std::move(frame).value(), a.get(), b.get());
  REQUIRE(got.ok());
  CHECK(got->msg["blob"] == blob->size());
  CHECK(got->fds.size() == 260);
  CHECK(got->blob == *blob);

  auto too_big = OutgoingFrame::Make(json{{"type", "attach"}}, {}, kMaxMessageBytes,
                                     std::make_shared<const std::string>(kMaxBlobBytes + 1, 'x'));
  REQUIRE_FALSE(too_big.ok());
  CHECK_THAT(too_big.error().message(), Catch::Contains("tensor table is too large"));
}

TEST_CASE("messages round-trip and decoders refuse malformed ones naming the field", "[client][protocol]") {
  Fingerprint fp = SomeFingerprint();
  HelloMsg hello{kProtocolVersion, "engine-a", ClientRole::kInspect, fp};
  auto h = DecodeHello(EncodeHello(hello));
  REQUIRE(h.ok());
  CHECK(h->client == "engine-a");
  CHECK(h->role == ClientRole::kInspect);
  REQUIRE(h->fingerprint);
  CHECK(h->fingerprint->Compare(fp).empty());
  auto no_fp = DecodeHello(EncodeHello(HelloMsg{1, "k", ClientRole::kKeeper, std::nullopt}));
  REQUIRE(no_fp.ok());
  CHECK_FALSE(no_fp->fingerprint);
  CHECK(no_fp->tensor_table == 0);
  CHECK_FALSE(EncodeHello(HelloMsg{1, "k", ClientRole::kKeeper, std::nullopt}).contains("tensor_table"));
  auto table =
      DecodeHello(EncodeHello(HelloMsg{1, "k", ClientRole::kKeeper, std::nullopt, kTensorTableVersion}));
  REQUIRE(table.ok());
  CHECK(table->tensor_table == kTensorTableVersion);

  MismatchMsg mm{{{"tp_rank", "1", "0"}, {"dtype", "bf16", "f32"}}, "differs"};
  auto m = DecodeMismatch(EncodeMismatch(mm));
  REQUIRE(m.ok());
  REQUIRE(m->diffs.size() == 2);
  CHECK(m->diffs[1].field == "dtype");
  CHECK(m->diffs[1].ours == "bf16");
  CHECK(m->diffs[1].theirs == "f32");
  CHECK(EncodeMismatch(mm)["diffs"][0]["holder"] == "0");

  auto e = DecodeError(EncodeError(Refused("no")));
  REQUIRE(e.ok());
  CHECK(e->code == "refused");
  Error back = ErrorFromReply(*e, "/s");
  CHECK(back.code() == Code::kRefused);
  CHECK_THAT(back.message(), Catch::Contains("/s: the holder answered: no"));
  CHECK(ErrorFromReply(ErrorMsg{"timeout", "t"}, "/s").code() == Code::kTimeout);
  CHECK(ErrorFromReply(ErrorMsg{"martian", "t"}, "/s").code() == Code::kRefused);

  InfoMsg info;
  info.fingerprint = fp;
  info.tensors = 21;
  info.bytes = 5641216;
  info.backend = "host";
  info.client_list.push_back(ClientEntry{"e", "engine", 42, 0, true});
  auto i = DecodeInfo(EncodeInfo(info));
  REQUIRE(i.ok());
  CHECK(i->tensors == 21);
  CHECK(i->bytes == 5641216);
  REQUIRE(i->client_list.size() == 1);
  CHECK(i->client_list[0].pid == 42);
  CHECK(i->client_list[0].attached);
  // The limits and counters travel; a holder that sends none reads as 0,
  // and one that sends a wrong type is refused.
  info.max_connections = 1000;
  info.idle_timeout_ms = 60000;
  info.attaches = 7;
  info.closed_idle = 5;
  info.evicted = 2;
  auto limits = DecodeInfo(EncodeInfo(info));
  REQUIRE(limits.ok());
  CHECK(limits->max_connections == 1000);
  CHECK(limits->idle_timeout_ms == 60000);
  CHECK(limits->attaches == 7);
  CHECK(limits->closed_idle == 5);
  CHECK(limits->evicted == 2);
  json older = EncodeInfo(info);
  for (const char* key : {"max_connections", "idle_timeout_ms", "attaches", "closed_idle", "evicted"}) older.erase(key);
  auto from_older = DecodeInfo(older);
  REQUIRE(from_older.ok());
  CHECK(from_older->max_connections == 0);
  CHECK(from_older->evicted == 0);
  json wrong = EncodeInfo(info);
  wrong["evicted"] = "2";
  auto bad_counter = DecodeInfo(wrong);
  REQUIRE_FALSE(bad_counter.ok());
  CHECK_THAT(bad_counter.error().message(), Catch::Contains("'evicted'"));

  struct Bad {
    json msg;
    const char* says;
  };
  std::vector<Bad> bad_hellos = {
      {{{"type", "hello"}, {"client", "x"}, {"role", "engine"}}, "'version'"},
      {{{"type", "hello"}, {"version", "1"}, {"client", "x"}, {"role", "engine"}}, "'version'"},
      {{{"type", "hello"}, {"version", 1}, {"role", "engine"}}, "'client'"},
      {{{"type", "hello"}, {"version", 1}, {"client", std::string(300, 'x')}, {"role", "engine"}},
       "client name"},
      {{{"type", "hello"}, {"version", 1}, {"client", "a\nb"}, {"role", "engine"}}, "control characters"},
      {{{"type", "hello"}, {"version", 1}, {"client", "x"}, {"role", "god"}}, "role 'god'"},
      {{{"type", "hello"}, {"version", 1}, {"client", "x"}, {"role", "engine"}, {"fingerprint", {{"a", 1}}}},
       "fingerprint"},
      {{{"type", "hello"}, {"version", 1}, {"client", "x"}, {"role", "engine"}, {"fingerprint", "x"}},
       "fingerprint"},
      {{{"type", "hello"}, {"version", 1}, {"client", "x"}, {"role", "engine"}, {"tensor_table", "1"}},
       "'tensor_table'"},
      {{{"type", "hello"}, {"version", 1}, {"client", "x"}, {"role", "engine"}, {"tensor_table", -1}},
       "'tensor_table'"},
  };
  for (const Bad& b : bad_hellos) {
    auto r = DecodeHello(b.msg);
    INFO(b.msg.dump());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message(), Catch::Contains(b.says));
  }
  CHECK_FALSE(DecodeAttach(json{{"type", "attach"}}).ok());
  CHECK_FALSE(DecodeAttach(json{{"type", "attach"}, {"manifest", 1}, {"fingerprint", json::object()}}).ok());
  CHECK_FALSE(DecodeMismatch(json{{"type", "mismatch"}, {"diffs", {{{"field", 1}}}}}).ok());
  CHECK_FALSE(DecodeInfo(json{{"type", "info"}}).ok());
  CHECK_FALSE(DecodeError(json{{"type", "error"}}).ok());
}

TEST_CASE("arena records round-trip through a file, bad ones name the file", "[client][protocol]") {
  test::TempDir dir;
  ArenaRecord r;
  r.manifest.backend = "host";
  r.manifest.device = -1;
  r.manifest.device_uuid = "host";
  r.manifest.allocations.push_back(ManifestAllocation{4096});
  r.manifest.entries.push_back(ManifestEntry{"w", "F32", {4, 4}, 0, 0, 64});
  r.fingerprint = SomeFingerprint();
  std::string path = dir.Join("arena.json");
  REQUIRE(WriteArenaRecord(path, r).ok());
  struct stat st{};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto back = ReadArenaRecord(path);
  REQUIRE(back.ok());
  CHECK(back->manifest.entries.size() == 1);
  CHECK(back->manifest.entries[0].shape == std::vector<int64_t>{4, 4});
  CHECK(back->fingerprint.Compare(r.fingerprint).empty());

  std::string bad = dir.Join("bad.json");
  for (std::string text : {std::string("not json"), std::string("{}"),
                           std::string(R"({"format":"wsup-arena-record","manifest":{},"fingerprint":{}})")}) {
    std::ofstream(bad, std::ios::trunc) << text;
    auto rr = ReadArenaRecord(bad);
    REQUIRE_FALSE(rr.ok());
    CHECK_THAT(rr.error().message(), Catch::Contains("bad.json"));
  }
  CHECK_FALSE(ReadArenaRecord(dir.Join("missing.json")).ok());
}

TEST_CASE("socket names are keyed by deployment and device, never collide, and fit", "[client][protocol]") {
  std::string a = DefaultSocketPath("/run/wsup", "chat", "GPU-1111");
  CHECK(a == "/run/wsup/holder-chat@GPU-1111.sock");
  CHECK(DefaultSocketPath("/run/wsup", "chat", "GPU-1111") == a);
  std::set<std::string> all = {a,
                               DefaultSocketPath("/run/wsup", "chat", "GPU-2222"),
                               DefaultSocketPath("/run/wsup", "code", "GPU-1111"),
                               DefaultSocketPath("/run/wsup", "chat/x", "GPU-1111"),
                               DefaultSocketPath("/run/wsup", "chat_x", "GPU-1111"),
                               DefaultSocketPath("/run/wsup", "chat-GPU", "1111"),
                               DefaultSocketPath("/run/wsup", "", "GPU-1111"),
                               DefaultSocketPath("/run/wsup", "..", "GPU-1111")};
  CHECK(all.size() == 8);
  for (const std::string& p : all) {
    CHECK(p.rfind("/run/wsup/holder-", 0) == 0);
    CHECK(p.find('/', 10) == std::string::npos);  // one file name inside the runtime dir
  }
  std::string long_dir = "/var/run/" + std::string(60, 'd');
  std::string l1 = DefaultSocketPath(long_dir, std::string(80, 'x'), "GPU-1");
  std::string l2 = DefaultSocketPath(long_dir, std::string(80, 'x'), "GPU-2");
  CHECK(l1.size() <= MaxSocketPathLength());
  CHECK(l1 != l2);
}

TEST_CASE("modes without a holder: off never connects, client loads from disk, daemon fails",
          "[client][modes]") {
  test::TempDir dir;
  Fingerprint fp = SomeFingerprint();
  AttachOptions o;
  o.socket_path = dir.Join("absent.sock");

  o.mode = AttachMode::kOff;
  auto off = Attach(o, fp);
  REQUIRE(off.ok());
  CHECK(off->outcome.source == WeightSource::kDisk);
  CHECK(off->outcome.reason == "mode off");
  CHECK_FALSE(off->attachment);

  o.mode = AttachMode::kClient;
  auto client = Attach(o, fp);
  REQUIRE(client.ok());
  CHECK(client->outcome.source == WeightSource::kDisk);
  CHECK_THAT(client->outcome.reason, Catch::Contains("holder unavailable") && Catch::Contains("absent.sock"));
  CHECK(client->outcome.diffs.empty());

  o.mode = AttachMode::kDaemon;
  auto daemon = Attach(o, fp);
  REQUIRE_FALSE(daemon.ok());
  CHECK(daemon.error().code() == Code::kUnavailable);
  CHECK_THAT(daemon.error().message(), Catch::Contains("absent.sock") && Catch::Contains("start wsup-holder"));

  o.socket_path.clear();
  CHECK(Attach(o, fp).error().code() == Code::kInvalidArgument);

  CHECK(ParseAttachMode("daemon").value() == AttachMode::kDaemon);
  CHECK(ParseAttachMode("client").value() == AttachMode::kClient);
  CHECK(ParseAttachMode("off").value() == AttachMode::kOff);
  auto bad = ParseAttachMode("sometimes");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.error().message(), Catch::Contains("daemon, client, off"));

  CHECK(QueryHolderInfo(dir.Join("absent.sock"), 1000).error().code() == Code::kUnavailable);
  CHECK(AttachKeeper(dir.Join("absent.sock"), "k", 1000).error().code() == Code::kUnavailable);
}

TEST_CASE("a peer that is not a holder: the client gives up within its bound", "[client][modes]") {
  test::TempDir dir;
  std::string path = dir.Join("mute.sock");
  // A listener that accepts (the kernel does, through the backlog) but never answers.
  UniqueFd l = ListenUnix(path);
  AttachOptions o;
  o.socket_path = path;
  o.timeout_ms = 200;
  o.mode = AttachMode::kDaemon;
  auto d = Attach(o, SomeFingerprint());
  REQUIRE_FALSE(d.ok());
  CHECK(d.error().code() == Code::kTimeout);
  o.mode = AttachMode::kClient;
  auto c = Attach(o, SomeFingerprint());
  REQUIRE(c.ok());
  CHECK(c->outcome.source == WeightSource::kDisk);
  CHECK_THAT(c->outcome.reason, Catch::Contains("no reply from the holder within 200 ms"));
}

TEST_CASE("a holder that turns a connection away before reading: the client reports its reason",
          "[client][protocol]") {
  test::TempDir dir;
  std::string path = dir.Join("full.sock");
  UniqueFd l = ListenUnix(path);
  auto ch = Channel::Connect(path, 5000);
  REQUIRE(ch.ok());
  {
    // What the holder does at its connection limit: say why, hang up, read nothing.
    UniqueFd c(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
    REQUIRE(c.valid());
    auto why = EncodeFrame(EncodeError(Unavailable("the holder has 3 connections open, its limit")));
    REQUIRE(why.ok());
    REQUIRE(::send(c.get(), why->data(), why->size(), MSG_NOSIGNAL) == static_cast<ssize_t>(why->size()));
  }
  // The request meets a closed socket; the reason is the reply.
  auto r = ch->Call(EncodeInfoRequest(), 5000);
  REQUIRE(r.ok());
  CHECK(r->type() == "error");
  CHECK_THAT(r->msg["message"].get<std::string>(), Catch::Contains("3 connections open, its limit"));
  // With nothing said before the hang-up, the send's own error stays.
  auto ch2 = Channel::Connect(path, 5000);
  REQUIRE(ch2.ok());
  UniqueFd(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC)).Reset();
  auto silent = ch2->Call(EncodeInfoRequest(), 5000);
  REQUIRE_FALSE(silent.ok());
  CHECK(silent.error().code() == Code::kIo);
}

// A stand-in holder for one connection at a time: reads the hello, writes
// the given bytes, hangs up. Runs on its own thread; every wait is bounded.
class FakeHolder {
 public:
  explicit FakeHolder(const std::string& path) {
    listen_ = ListenUnix(path);
  }
  ~FakeHolder() {
    if (thread_.joinable()) thread_.join();
  }
  void ServeOnce(std::string reply) {
    if (thread_.joinable()) thread_.join();
    thread_ = std::thread([this, reply = std::move(reply)] {
      pollfd p{listen_.get(), POLLIN, 0};
      if (::poll(&p, 1, 10'000) != 1) return;
      UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      FrameReader r(kMaxMessageBytes, false);
      for (int i = 0; i < 1000; ++i) {
        auto next = r.Next();
        if (!next.ok() || next->has_value()) break;
        pollfd q{c.get(), POLLIN, 0};
        if (::poll(&q, 1, 10'000) != 1) return;
        auto st = r.ReadSome(c.get(), 1 << 16);
        if (!st.ok() || *st == FrameReader::ReadState::kEof) return;
      }
      size_t off = 0;
      while (off < reply.size()) {
        ssize_t n = ::send(c.get(), reply.data() + off, reply.size() - off, MSG_NOSIGNAL);
        if (n <= 0) return;
        off += static_cast<size_t>(n);
      }
    });
  }

 private:
  UniqueFd listen_;
  std::thread thread_;
};

TEST_CASE("a holder that sends a bad tensor table gets a clear refusal, or disk in client mode",
          "[client][modes]") {
  test::TempDir dir;
  const std::string path = dir.Join("fake.sock");
  FakeHolder holder(path);
  Manifest m = test::HostManifest({{4096}});
  m.entries = {{"w", "F32", {4}, 0, 0, 16}};
  const std::string table = EncodeTensorTable(m.entries).value();
  auto attach_with = [&](const std::string& blob, uint64_t announced) {
    json msg = EncodeAttach(ManifestHeaderToJson(m, blob.size()), SomeFingerprint(), {});
    msg["blob"] = announced;
    return EncodeFrame(msg).value() + Prefix(static_cast<uint32_t>(blob.size())) + blob;
  };
  std::string garbage(table.size(), 'g');
  struct Case {
    const char* what;
    std::string reply;
    Code code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"cut short inside the table",
       [&] {
         std::string r = attach_with(table, table.size());
         return r.substr(0, r.size() - 40);
       }(),
       Code::kUnavailable, "closed the connection in the middle of a message"},
      {"garbage of the announced size", attach_with(garbage, garbage.size()), Code::kCorrupt,
       "tensor table: does not start with \"wsupTTBL\""},
      {"a table of another size than announced", attach_with(table, table.size() + 1), Code::kCorrupt,
       "binary part of " + std::to_string(table.size() + 1) + " bytes but the frame after it holds"},
      {"an oversized announcement", attach_with(table, uint64_t{kMaxBlobBytes} + 1), Code::kCorrupt,
       "this side accepts 1 to"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    AttachOptions o;
    o.socket_path = path;
    o.timeout_ms = 10'000;
    o.mode = AttachMode::kDaemon;
    holder.ServeOnce(c.reply);
    auto d = Attach(o, SomeFingerprint());
    REQUIRE_FALSE(d.ok());
    INFO(d.error().message());
    CHECK(d.error().code() == c.code);
    CHECK_THAT(d.error().message(), Catch::Contains(c.says) && Catch::Contains("fake.sock"));
    o.mode = AttachMode::kClient;
    holder.ServeOnce(c.reply);
    auto cl = Attach(o, SomeFingerprint());
    REQUIRE(cl.ok());
    CHECK(cl->outcome.source == WeightSource::kDisk);
    CHECK_FALSE(cl->attachment);
    CHECK_THAT(cl->outcome.reason, Catch::Contains(c.says));
  }
}

TEST_CASE("the C ABI checks its arguments and reports without a holder", "[client][capi]") {
  test::TempDir dir;
  std::string sock = dir.Join("absent.sock");
  std::string model = test::TestData("llama-tiny-f32");

  wsup_attachment* off = wsup_attach(sock.c_str(), "off", nullptr, nullptr, nullptr);
  REQUIRE(off != nullptr);
  CHECK(wsup_status(off) == WSUP_OK);
  CHECK(wsup_from_holder(off) == 0);
  CHECK(std::string(wsup_reason(off)) == "mode off");
  CHECK(wsup_num_tensors(off) == 0);
  CHECK(wsup_tensor_data(off, "x") == nullptr);
  CHECK(std::string(wsup_diffs_json(off)) == "[]");
  size_t len = 99;
  CHECK(wsup_manifest_table(off, &len) == nullptr);  // nothing attached: no block
  CHECK(len == 0);
  CHECK(wsup_manifest_table(off, nullptr) == nullptr);
  wsup_detach(off);

  wsup_attachment* client = wsup_attach(sock.c_str(), "client", nullptr, model.c_str(), R"({"timeout_ms": 500})");
  CHECK(wsup_status(client) == WSUP_OK);
  CHECK(std::string(wsup_source(client)) == "disk");
  CHECK_THAT(std::string(wsup_reason(client)), Catch::Contains("holder unavailable"));
  len = 99;
  CHECK(wsup_manifest_table(client, &len) == nullptr);  // load from disk: no block
  CHECK(len == 0);
  wsup_detach(client);

  wsup_attachment* daemon = wsup_attach(sock.c_str(), "daemon", nullptr, model.c_str(), nullptr);
  CHECK(wsup_status(daemon) == WSUP_ERR_UNAVAILABLE);
  CHECK_THAT(std::string(wsup_error(daemon)), Catch::Contains("absent.sock"));
  len = 99;
  CHECK(wsup_manifest_table(daemon, &len) == nullptr);  // a failed attach: no block
  CHECK(len == 0);
  wsup_detach(daemon);

  struct Bad {
    const char* mode;
    const char* fp;
    const char* dir;
    const char* opts;
    int status;
    const char* says;
  };
  std::string bad_dir = dir.Join("no-model");
  std::vector<Bad> bad = {
      {"sometimes", nullptr, model.c_str(), nullptr, WSUP_ERR_INVALID_ARGUMENT, "sometimes"},
      {nullptr, nullptr, model.c_str(), nullptr, WSUP_ERR_INVALID_ARGUMENT, "mode"},
      {"client", "{}", model.c_str(), nullptr, WSUP_ERR_INVALID_ARGUMENT, "exactly one"},
      {"client", nullptr, nullptr, nullptr, WSUP_ERR_INVALID_ARGUMENT, "exactly one"},
      {"client", "not json", nullptr, nullptr, WSUP_ERR_CORRUPT, "fingerprint_json"},
      {"client", R"({"a": 1})", nullptr, nullptr, WSUP_ERR_INVALID_ARGUMENT, "'a'"},
      {"client", nullptr, model.c_str(), "[1]", WSUP_ERR_CORRUPT, "options_json"},
      {"client", nullptr, model.c_str(), R"({"tp_size": "two"})", WSUP_ERR_INVALID_ARGUMENT, "tp_size"},
      {"client", nullptr, model.c_str(), R"({"backend": "tpu"})", WSUP_ERR_INVALID_ARGUMENT, "tpu"},
      {"client", nullptr, model.c_str(), R"({"timeout_ms": 0})", WSUP_ERR_INVALID_ARGUMENT, "timeout_ms"},
      {"client", nullptr, bad_dir.c_str(), nullptr, -1, "no-model"},
  };
  for (const Bad& b : bad) {
    wsup_attachment* a = wsup_attach(sock.c_str(), b.mode, b.fp, b.dir, b.opts);
    REQUIRE(a != nullptr);
    INFO(wsup_error(a));
    if (b.status >= 0) {
      CHECK(wsup_status(a) == b.status);
    } else {
      CHECK(wsup_status(a) != WSUP_OK);
    }
    CHECK_THAT(std::string(wsup_error(a)), Catch::Contains(b.says));
    CHECK(wsup_from_holder(a) == 0);
    wsup_detach(a);
  }
  // NULL handles are harmless.
  CHECK(wsup_status(nullptr) != WSUP_OK);
  CHECK(wsup_num_tensors(nullptr) == 0);
  CHECK(wsup_tensor_name(nullptr, 0) == nullptr);
  len = 99;
  CHECK(wsup_manifest_table(nullptr, &len) == nullptr);
  CHECK(len == 0);
  CHECK(wsup_manifest_table(nullptr, nullptr) == nullptr);
  wsup_detach(nullptr);
}

TEST_CASE("libwsup_client.so exports the C ABI and nothing of C++", "[client][capi]") {
  std::string lib = std::string(WSUP_BIN_DIR) + "/../lib/libwsup_client.so";
  void* h = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  INFO((h ? "" : ::dlerror()));
  REQUIRE(h != nullptr);
  for (const char* sym : {"wsup_attach", "wsup_status", "wsup_error", "wsup_from_holder", "wsup_reason",
                          "wsup_num_tensors", "wsup_tensor_name", "wsup_tensor_data", "wsup_tensor_dtype",
                          "wsup_tensor_ndim", "wsup_tensor_dim", "wsup_tensor_nbytes", "wsup_detach",
                          "wsup_client_version", "wsup_publish_begin", "wsup_has_lease", "wsup_publish_alloc",
                          "wsup_publish_commit", "wsup_publish_abort", "wsup_tensor_stride",
                          "wsup_manifest_table", "wsup_kv_pool_fetch", "wsup_kv_pool_status", "wsup_kv_pool_error",
                          "wsup_kv_pool_json", "wsup_kv_pool_allocations", "wsup_kv_pool_fd",
                          "wsup_kv_pool_allocation_bytes", "wsup_kv_pool_release", "wsup_kv_token_hash"}) {
    INFO(sym);
    CHECK(::dlsym(h, sym) != nullptr);
  }
  // The C++ insides stay hidden, so they cannot clash with the host program's.
  CHECK(::dlsym(h, "_ZN4wsup6AttachERKNS_13AttachOptionsERKNS_11FingerprintE") == nullptr);
  using VersionFn = const char* (*)();
  auto version = reinterpret_cast<VersionFn>(::dlsym(h, "wsup_client_version"));
  REQUIRE(version);
  CHECK(std::string(version()).find('.') != std::string::npos);
  using AttachFn = wsup_attachment* (*)(const char*, const char*, const char*, const char*, const char*);
  using StatusFn = int (*)(const wsup_attachment*);
  using DetachFn = void (*)(wsup_attachment*);
  auto attach = reinterpret_cast<AttachFn>(::dlsym(h, "wsup_attach"));
  auto status = reinterpret_cast<StatusFn>(::dlsym(h, "wsup_status"));
  auto detach = reinterpret_cast<DetachFn>(::dlsym(h, "wsup_detach"));
  wsup_attachment* a = attach("/nonexistent/x.sock", "off", nullptr, nullptr, nullptr);
  CHECK(status(a) == WSUP_OK);
  detach(a);
  ::dlclose(h);
}

}  // namespace
}  // namespace wsup
