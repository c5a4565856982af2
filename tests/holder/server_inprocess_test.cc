// HolderServer inside the test process: its loop runs on a second thread,
// clients run on the test thread, and the test ends by closing the server and
// asserting that the loop closes clean (every handle closed, nothing leaked).

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <uv.h>

#include <catch2/catch.hpp>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <filesystem>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "client/client.h"
#include "client/publish.h"
#include "holder/arena.h"
#include "holder/layout_store.h"
#include "holder/server.h"
#include "tests/holder/holder_fixture.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;

// Server options with the socket at dir/sock/h.sock (a folder the server
// makes).
ServerOptions SocketIn(const test::TempDir& dir) {
  ServerOptions so;
  so.socket_path = dir.Join("sock/h.sock");
  return so;
}

Arena LoadArena(const std::string& model) {
  auto ckpt = Checkpoint::Open(test::TestData(model));
  REQUIRE(ckpt.ok());
  auto shards = PlanShards(*ckpt, ShardSpec{});
  REQUIRE(shards.ok());
  auto arena = Arena::Load(*ckpt, *shards, LoadOptions{});
  REQUIRE(arena.ok());
  return std::move(arena).value();
}

// Runs a HolderServer on its own loop thread until Stop().
class LoopThread {
 public:
  LoopThread(const Arena& arena, Fingerprint fp, ServerOptions so) : server_(&loop_, arena, std::move(fp), so) {
    uv_loop_init(&loop_);
  }
  LoopThread(LayoutStore* layouts, Fingerprint fp, ServerOptions so) : server_(&loop_, layouts, std::move(fp), so) {
    uv_loop_init(&loop_);
  }
  ~LoopThread() {
    if (thread_.joinable()) Stop();
  }
  Status Start() {
    Status s = server_.Start();
    if (!s.ok()) return s;
    uv_async_init(&loop_, &stop_, &LoopThread::OnStop);
    stop_.data = this;
    thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
    return s;
  }
  // Returns uv_loop_close's result: 0 when every handle was closed.
  int Stop() {
    uv_async_send(&stop_);
    thread_.join();
    return uv_loop_close(&loop_);
  }

 private:
  static void OnStop(uv_async_t* a) {
    auto* self = static_cast<LoopThread*>(a->data);
    self->server_.Close([a] { uv_close(reinterpret_cast<uv_handle_t*>(a), nullptr); });
  }
  uv_loop_t loop_{};
  HolderServer server_;
  uv_async_t stop_{};
  std::thread thread_;
};

TEST_CASE("HolderServer serves on its loop and closes every handle on Close()", "[holder][server][inprocess]") {
  const std::string model = "llama-tiny-f32";
  Arena arena = LoadArena(model);
  Fingerprint fp = test::EngineFingerprint(test::TestData(model));
  test::TempDir dir;
  ServerOptions so = SocketIn(dir);
  so.handshake_timeout_ms = 200;
  so.deployment = "inproc";
  LoopThread lt(arena, fp, so);
  REQUIRE(lt.Start().ok());

  AttachOptions o;
  o.socket_path = so.socket_path;
  auto a = Attach(o, fp);
  REQUIRE(a.ok());
  REQUIRE(a->attachment);
  for (const auto& [name, want] : test::ReadTensorsJson(model)) {
    TensorView v = a->attachment->Find(name);
    REQUIRE(v.entry);
    CHECK(Sha256Hex(v.data, v.entry->nbytes) == want.sha256);
  }

  // A silent client is dropped by its timer.
  auto silent = Channel::Connect(so.socket_path, 5000);
  REQUIRE(silent.ok());
  auto r = silent->Receive(5000);
  REQUIRE(r.ok());
  CHECK(r->type() == "error");
  CHECK(r->msg["code"] == "timeout");

  // A keeper and a half-sent request are still open when the server closes.
  auto kept = AttachKeeper(so.socket_path, "keeper", 5000);
  REQUIRE(kept.ok());
  auto half = Channel::Connect(so.socket_path, 5000);
  REQUIRE(half.ok());
  REQUIRE(::send(half->fd(), "\x40\x00\x00\x00{", 5, MSG_NOSIGNAL) == 5);
  auto info = QueryHolderInfo(so.socket_path, 5000);
  REQUIRE(info.ok());
  CHECK(info->clients == 2);
  CHECK(info->deployment == "inproc");

  CHECK(lt.Stop() == 0);
  CHECK_FALSE(std::filesystem::exists(so.socket_path));
  // Its clients see the end.
  auto eof = kept->channel.Receive(5000);
  REQUIRE_FALSE(eof.ok());
  CHECK(eof.error().code() == Code::kUnavailable);
  // The mapping does not depend on the server.
  TensorView v = a->attachment->Find("lm_head.weight");
  REQUIRE(v.entry);
  CHECK(Sha256Hex(v.data, v.entry->nbytes) == test::ReadTensorsJson(model)["lm_head.weight"].sha256);
}

TEST_CASE("attach replies carry a tensor table to clients that ask and JSON to others, same tensors",
          "[holder][server][inprocess]") {
  const std::string model = "llama-tiny-bf16-sharded";
  Arena arena = LoadArena(model);
  Fingerprint fp = test::EngineFingerprint(test::TestData(model));
  test::TempDir dir;
  ServerOptions so = SocketIn(dir);
  LoopThread lt(arena, fp, so);
  REQUIRE(lt.Start().ok());
  const std::string want = ManifestToJson(arena.manifest()).dump();
  const auto hashes = test::ReadTensorsJson(model);

  // On the wire: a header and a binary part, or every entry as JSON.
  for (uint32_t table : {kTensorTableVersion, 0u}) {
    INFO("tensor_table " << table);
    auto ch = Channel::Connect(so.socket_path, 5000);
    REQUIRE(ch.ok());
    HelloMsg hello;
    hello.client = "raw";
    hello.role = ClientRole::kKeeper;
    hello.tensor_table = table;
    auto reply = ch->Call(EncodeHello(hello), 5000);
    REQUIRE(reply.ok());
    REQUIRE(reply->type() == "attach");
    const auto& manifest = reply->msg["manifest"];
    CHECK(manifest.contains("tensor_table") == (table > 0));
    CHECK(manifest.contains("entries") == (table == 0));
    CHECK(reply->blob.empty() == (table == 0));
    auto decoded = DecodeAttach(reply->msg, reply->blob);
    REQUIRE(decoded.ok());
    CHECK(ManifestToJson(decoded->manifest).dump() == want);
    CHECK(reply->fds.size() == arena.manifest().allocations.size());
  }

  // Through the client: both ways map every tensor, byte for byte, and the
  // phases of the attach are reported.
  for (bool table : {true, false}) {
    INFO("tensor table " << table);
    AttachOptions o;
    o.socket_path = so.socket_path;
    o.tensor_table = table;
    auto a = Attach(o, fp);
    REQUIRE(a.ok());
    REQUIRE(a->attachment);
    const AttachPhases& p = a->outcome.phases;
    CHECK(p.handshake_ms > 0);
    CHECK(p.decode_ms > 0);
    CHECK(p.index_ms > 0);
    CHECK(p.connect_ms + p.handshake_ms + p.decode_ms + p.checks_ms + p.index_ms + p.map_ms <= a->outcome.ms);
    REQUIRE(a->attachment->size() == hashes.size());
    for (const auto& [name, h] : hashes) {
      TensorView v = a->attachment->Find(name);
      REQUIRE(v.entry);
      CHECK(Sha256Hex(v.data, v.entry->nbytes) == h.sha256);
    }
  }
  // The keeper reads the table and keeps a record equal to the arena's.
  auto kept = AttachKeeper(so.socket_path, "keeper", 5000);
  REQUIRE(kept.ok());
  CHECK(ManifestToJson(kept->record.manifest).dump() == want);
  kept->channel.Close();
  CHECK(lt.Stop() == 0);
}

TEST_CASE("HolderServer: Close() without Start() and a failed Start() leave the loop clean",
          "[holder][server][inprocess]") {
  Arena arena = LoadArena("llama-tiny-f32");
  uv_loop_t loop;
  uv_loop_init(&loop);
  {
    ServerOptions so;
    so.socket_path = "/tmp/h.sock";  // /tmp is world-writable: refused
    HolderServer s(&loop, arena, Fingerprint(), so);
    Status st = s.Start();
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == Code::kRefused);
    CHECK_THAT(st.error().message(), Catch::Contains("chmod 700 /tmp"));
    bool closed = false;
    s.Close([&] { closed = true; });
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(closed);
  }
  CHECK(uv_loop_close(&loop) == 0);
}

TEST_CASE("PrepareSocketPath removes a stale socket and refuses what is not one", "[holder][server][inprocess]") {
  test::TempDir dir;
  std::string path = dir.Join("stale.sock");
  {
    // A socket file whose listener is gone.
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    ::close(fd);
  }
  REQUIRE(std::filesystem::exists(path));
  CHECK(PrepareSocketPath(path).ok());
  CHECK_FALSE(std::filesystem::exists(path));

  std::string plain = dir.Join("plain");
  std::ofstream(plain) << "x";
  Status s = PrepareSocketPath(plain);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK_THAT(s.error().message(), Catch::Contains("not a socket"));
  CHECK(std::filesystem::exists(plain));

  CHECK(PrepareSocketPath("").code() == Code::kInvalidArgument);
  CHECK(PrepareSocketPath(dir.Join(std::string(200, 'a'))).code() == Code::kInvalidArgument);
  CHECK(PrepareSocketPath(plain + "/under-a-file.sock").code() == Code::kInvalidArgument);
}

}  // namespace
}  // namespace wsup

namespace wsup {
namespace {

// Host layout memory whose Idle() (on a cuda holder: tearing the writers'
// context down, tens of milliseconds) blocks until the test lets it go, and
// records when it ran.
class SlowIdleMemory final : public LayoutMemory {
 public:
  SlowIdleMemory() : host_(MakeHostLayoutMemory()) {}
  const char* backend() const override { return host_->backend(); }
  const char* handle() const override { return host_->handle(); }
  int device() const override { return host_->device(); }
  std::string device_uuid() const override { return host_->device_uuid(); }
  uint64_t granularity() const override { return host_->granularity(); }
  Result<UniqueFd> Allocate(uint64_t bytes, uint64_t* size) override { return host_->Allocate(bytes, size); }
  Status Seal(int fd, uint32_t index) override { return host_->Seal(fd, index); }
  Status CheckAdopted(int fd, uint32_t index, uint64_t size) const override {
    return host_->CheckAdopted(fd, index, size);
  }
  void Idle() override {
    std::unique_lock<std::mutex> lock(mu_);
    ++started_;
    cv_.notify_all();
    // Bounded: a server that idles before replying blocks its writer until
    // here, and the test then sees this finished before the commit returned.
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return go_; });
    ++finished_;
    cv_.notify_all();
  }

  void Go() {
    std::lock_guard<std::mutex> lock(mu_);
    go_ = true;
    cv_.notify_all();
  }
  int finished() {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }
  int started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }
  bool WaitFinished(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return finished_ >= n; });
  }

 private:
  std::unique_ptr<LayoutMemory> host_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool go_ = false;
  int started_ = 0;
  int finished_ = 0;
};

TEST_CASE("a layout commit is answered before the holder lets the writers' device context go",
          "[holder][server][inprocess][layout]") {
  auto owned = std::make_unique<SlowIdleMemory>();
  SlowIdleMemory* memory = owned.get();
  LayoutStore store(std::move(owned));
  Fingerprint holder_fp;
  holder_fp.Set("layout", "engine");
  holder_fp.Set("backend", "host");
  test::TempDir dir;
  ServerOptions so;
  so.socket_path = dir.Join("h.sock");
  so.deployment = "inproc";
  LoopThread lt(&store, holder_fp, so);
  REQUIRE(lt.Start().ok());

  Fingerprint fp;
  fp.Set("checkpoint", "0123");
  fp.Set("tp_rank", "0");
  AddEngineLayout(&fp, EngineLayoutId{"test-engine", "1", "none"});
  AttachOptions o;
  o.socket_path = so.socket_path;
  o.mode = AttachMode::kDaemon;
  o.client_name = "writer";
  o.timeout_ms = 30'000;
  auto first = AttachOrPublish(o, fp, 30'000);
  REQUIRE(first.ok());
  REQUIRE(first->publication != nullptr);
  auto r = first->publication->Allocate(4096);
  REQUIRE(r.ok());
  static_cast<float*>(r->data)[0] = 1.5f;
  CHECK(memory->started() == 0);  // a writer is writing: the context stays

  auto committed = first->publication->Commit({{"w", "F32", {1}, r->alloc, 0, 4}});
  // The reply came while Idle() had not finished: it was sent first.
  CHECK(memory->finished() == 0);
  memory->Go();
  REQUIRE(committed.ok());
  REQUIRE(committed->attachment != nullptr);
  TensorView v = committed->attachment->Find("w");
  REQUIRE(v.entry);
  CHECK(*static_cast<const float*>(v.data) == 1.5f);
  // ... and once it was sent, the context went, once.
  REQUIRE(memory->WaitFinished(1));
  CHECK(memory->started() == 1);

  committed->attachment.reset();
  CHECK(lt.Stop() == 0);
  CHECK(memory->finished() == 1);
}

}  // namespace
}  // namespace wsup
