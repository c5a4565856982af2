// Engine pieces on their own: the in-process communicator, request
// validation, the tokenizer, and the scheduler (batching, sampling, the
// keepalive and what a broken communicator does).
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "engine/api.h"
#include "engine/communicator.h"
#include "engine/runner.h"
#include "engine/scheduler.h"
#include "engine/tokenizer.h"
#include "tests/engine/tiny_runner.h"
#include "testkit/test_util.h"

using namespace std::chrono_literals;
using namespace wsup::engine;

TEST_CASE("communicator: all-reduce and all-gather over threads") {
  const int n = 3;
  auto comms = MakeInProcessGroup(n, 10s);
  std::vector<std::vector<float>> sums(n), gathered(n);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (int round = 0; round < 50; ++round) {
        std::vector<float> v = {static_cast<float>(r), static_cast<float>(round)};
        if (!comms[r]->AllReduceSum(v.data(), v.size()).ok()) ++failures;
        sums[r] = v;
        std::vector<float> in = {static_cast<float>(10 * r), static_cast<float>(10 * r + 1)};
        std::vector<float> out(2 * n);
        if (!comms[r]->AllGather(in.data(), 2, out.data()).ok()) ++failures;
        gathered[r] = out;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  for (int r = 0; r < n; ++r) {
    CHECK(sums[r] == std::vector<float>{3, 147});
    CHECK(gathered[r] == std::vector<float>{0, 1, 10, 11, 20, 21});
  }
}

TEST_CASE("communicator: a rank that never arrives breaks the group for everyone, in bounded time") {
  auto comms = MakeInProcessGroup(2, 100ms);
  float v = 1;
  auto t0 = std::chrono::steady_clock::now();
  auto st = comms[0]->AllReduceSum(&v, 1);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == wsup::Code::kTimeout);
  CHECK(st.error().message().find("restart the engine") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  // The other rank, arriving late, fails at once.
  CHECK(comms[1]->AllReduceSum(&v, 1).code() == wsup::Code::kTimeout);
}

TEST_CASE("api: defaults, token-id prompts, options") {
  ApiLimits limits{256, 512};
  auto r = ParseCompletionRequest(R"({"prompt": "Hi"})", limits);
  REQUIRE(r.ok());
  CHECK(r->prompt == std::vector<int32_t>{72, 105});
  CHECK(r->max_tokens == 16);
  CHECK(r->temperature == 0);
  CHECK_FALSE(r->stream);
  CHECK_FALSE(r->seed.has_value());

  r = ParseCompletionRequest(
      R"({"prompt": [1, 255], "max_tokens": 510, "temperature": 0.5, "seed": -1, "stream": true,
          "return_token_ids": true, "stream_options": {"include_usage": true}, "model": "m", "n": 1,
          "top_p": 1, "stop": null, "echo": false, "user": "ignored", "unknown": {"x": 1}})",
      limits);
  REQUIRE(r.ok());
  CHECK(r->prompt == std::vector<int32_t>{1, 255});
  CHECK(r->max_tokens == 510);
  CHECK(r->temperature == 0.5);
  CHECK(*r->seed == UINT64_MAX);
  CHECK(r->stream);
  CHECK(r->return_token_ids);
  CHECK(r->include_usage);

  // UTF-8 prompts are bytes.
  r = ParseCompletionRequest("{\"prompt\": \"\xc3\xa9\"}", limits);
  REQUIRE(r.ok());
  CHECK(r->prompt == std::vector<int32_t>{0xc3, 0xa9});

  // A prompt of 500 tokens leaves room for 12 at most.
  std::string long_prompt = "{\"prompt\": \"" + std::string(500, 'a') + "\"}";
  r = ParseCompletionRequest(long_prompt, limits);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message().find("at most 12") != std::string::npos);
  CHECK_FALSE(ParseCompletionRequest(R"({"prompt": "a", "max_tokens": 16.0})", limits).ok());
  CHECK_FALSE(ParseCompletionRequest(R"({"prompt": "a", "seed": 1.5})", limits).ok());
  CHECK_FALSE(ParseCompletionRequest(R"({"prompt": "a", "stop": ["x"]})", limits).ok());
  CHECK_FALSE(ParseCompletionRequest(R"({"prompt": "a", "temperature": 2.5})", limits).ok());
  CHECK_FALSE(ParseCompletionRequest(R"({"prompt": [[1, 2]]})", limits).ok());
  CHECK_FALSE(ParseCompletionRequest(R"({"prompt": [18446744073709551615]})", limits).ok());
  CHECK_FALSE(ParseCompletionRequest("", limits).ok());
  CHECK_FALSE(ParseCompletionRequest("\"\\ud800\"", limits).ok());
}

TEST_CASE("tokenizer: token t renders as U+00tt in UTF-8") {
  CHECK(DecodeTokens({72, 105}) == "Hi");
  CHECK(DecodeTokens({0xe9}) == "\xc3\xa9");
  CHECK(DecodeTokens({0}) == std::string(1, '\0'));
  CHECK(DecodeTokens({-1}) == "\xef\xbf\xbd");
  CHECK(EncodeBytes("\xc3\xa9") == std::vector<int32_t>{0xc3, 0xa9});
}

namespace {

// Rank 0 of 1 that works until told to fail.
class FlakyCommunicator : public Communicator {
 public:
  std::atomic<bool> fail{false};
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* kind() const override { return "flaky"; }
  wsup::Status AllReduceSum(float*, size_t) override {
    if (fail) return wsup::Unavailable("injected communicator failure");
    return wsup::Status::Ok();
  }
  wsup::Status AllGather(const float* in, size_t n, float* out) override {
    if (fail) return wsup::Unavailable("injected communicator failure");
    std::copy(in, in + n, out);
    return wsup::Status::Ok();
  }
};

std::unique_ptr<ModelRunner> TinyRunner(std::unique_ptr<Communicator> comm = nullptr) {
  auto ckpt = wsup::Checkpoint::Open(wsup::test::TestData("llama-tiny-f32"));
  REQUIRE(ckpt.ok());
  auto w = LoadWeightsFromDisk(*ckpt, wsup::ShardSpec{1, 0}, 1);
  REQUIRE(w.ok());
  std::vector<std::unique_ptr<WeightSource>> ws;
  ws.push_back(std::move(*w));
  RunnerOptions o;
  o.threads_per_rank = 1;
  auto r = ModelRunner::Create(ckpt->config(), std::move(ws), o);
  REQUIRE(r.ok());
  if (comm) {
    std::vector<std::unique_ptr<Communicator>> comms;
    comms.push_back(std::move(comm));
    REQUIRE(r.value()->InitCommunicator(std::move(comms)).ok());
  } else {
    REQUIRE(r.value()->InitCommunicator().ok());
  }
  REQUIRE(r.value()->AllocateKv(1 << 20, 16).ok());
  return std::move(r.value());
}

using Collector = testing::SchedulerEvents;

}  // namespace

TEST_CASE("scheduler: concurrent requests are batched - seeds reproduce samples") {
  auto runner = TinyRunner();
  Collector c;
  SchedulerOptions so;
  Scheduler s(runner.get(), so, c.Sink());
  GenRequest greedy;
  greedy.prompt = EncodeBytes("Hello, world");
  greedy.max_tokens = 16;
  for (uint64_t id = 1; id <= 8; ++id) {
    GenRequest g = greedy;
    g.id = id;
    REQUIRE(s.Submit(g).ok());
  }
  GenRequest sampled;
  sampled.prompt = EncodeBytes("wsup");
  sampled.max_tokens = 12;
  sampled.temperature = 1.0;
  sampled.seed = 42;
  for (uint64_t id : {100, 101}) {
    GenRequest g = sampled;
    g.id = id;
    REQUIRE(s.Submit(g).ok());
  }
  GenRequest other = sampled;
  other.id = 102;
  other.seed = 43;
  REQUIRE(s.Submit(other).ok());
  // Submitted before Start(): all are admitted together.
  s.Start();
  REQUIRE(wsup::test::WaitFor([&] { return c.done() == 11; }, 60s));
  const std::vector<int32_t> golden = {92, 16, 97, 246, 28, 201, 169, 207, 160, 234, 48, 216, 188, 48, 232, 118};
  for (uint64_t id = 1; id <= 8; ++id) {
    CHECK(c.tokens[id] == golden);
    CHECK(c.finished[id] == "length");
  }
  CHECK(c.tokens[100].size() == 12);
  CHECK(c.tokens[100] == c.tokens[101]);
  CHECK(c.tokens[100] != c.tokens[102]);
  SchedulerStats st = s.stats();
  CHECK(st.steps <= 17);  // one prompt step and 15 decode steps, all sequences together
  CHECK(st.free_blocks == st.total_blocks);
  CHECK(st.generated_tokens == 8 * 16 + 3 * 12);
  CHECK(st.prompt_tokens == 8 * greedy.prompt.size() + 3 * sampled.prompt.size());
}

TEST_CASE("scheduler: requests that can never fit are refused - cancelled ones free their blocks") {
  auto runner = TinyRunner();
  Collector c;
  Scheduler s(runner.get(), SchedulerOptions{}, c.Sink());
  GenRequest g;
  g.id = 1;
  g.prompt = EncodeBytes("hi");
  g.max_tokens = 600;
  auto st = s.Submit(g);
  CHECK(st.code() == wsup::Code::kInvalidArgument);
  CHECK(st.error().message().find("context of 512") != std::string::npos);
  g.prompt.clear();
  g.max_tokens = 1;
  CHECK(s.Submit(g).code() == wsup::Code::kInvalidArgument);

  s.Start();
  g.prompt = EncodeBytes("hi");
  g.max_tokens = 500;
  REQUIRE(s.Submit(g).ok());
  REQUIRE(wsup::test::WaitFor([&] { return s.stats().active == 1; }, 10s));
  s.Cancel(1);
  CHECK(wsup::test::WaitFor(
      [&] {
        auto st = s.stats();
        return st.active == 0 && st.free_blocks == st.total_blocks;
      },
      10s));
}

TEST_CASE("scheduler: a failing communicator shows in stats and refuses new work") {
  auto flaky = std::make_unique<FlakyCommunicator>();
  FlakyCommunicator* comm = flaky.get();
  auto runner = TinyRunner(std::move(flaky));
  Collector c;
  SchedulerOptions so;
  so.keepalive_ms = 10;
  Scheduler s(runner.get(), so, c.Sink());
  s.Start();
  REQUIRE(wsup::test::WaitFor([&] { return s.stats().keepalives >= 2; }, 10s));
  CHECK(s.stats().comm_ok);
  comm->fail = true;
  REQUIRE(wsup::test::WaitFor([&] { return !s.stats().comm_ok; }, 10s));
  auto st = s.stats();
  CHECK(st.keepalive_failures >= 1);
  CHECK(st.comm_error.find("injected") != std::string::npos);
  GenRequest g;
  g.id = 7;
  g.prompt = EncodeBytes("hi");
  g.max_tokens = 2;
  CHECK(s.Submit(g).code() == wsup::Code::kUnavailable);
}
