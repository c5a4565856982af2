// The engine's weight-cache modes against a real wsup-holder (host backend):
// daemon and client attach and serve the goldens zero-copy; client falls back
// to disk with its reason; daemon refuses a mismatch naming the fields; and
// a holder serving altered bytes changes the answers (the engine really
// computes on the holder's memory).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "tests/engine/engine_fixture.h"

using namespace std::chrono_literals;
using nlohmann::json;
using wsup::test::Proc;
using wsup::test::TempDir;

TEST_CASE("weight cache: daemon and client modes attach to the holder and serve the goldens") {
  TempDir dir;
  const std::string model = wsup::test::TestData("llama-tiny-f32");
  const std::string sock = dir.Join("h.sock");
  Proc holder = wsup::test::StartHolder(dir, model, sock);
  INFO(holder.Log());
  REQUIRE(holder.ready);
  for (const char* mode : {"daemon", "client"}) {
    Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--weight-cache", mode, "--socket", sock},
                                     std::string(mode) + ".log");
    INFO(mode << "\n" << e.Log());
    REQUIRE(e.ready);
    json st = wsup::test::GetJson(e.port, "/wsup/status");
    CHECK(st["weights"]["mode"] == mode);
    CHECK(st["weights"]["source"] == "holder");
    CHECK_FALSE(st["weights"].contains("miss_reason"));
    CHECK(wsup::test::AllOutputs(e.port, "llama-tiny-f32") == wsup::test::GoldenOutputs("llama-tiny-f32"));
    e.child.Kill(SIGTERM);
    CHECK(e.child.Wait(10s) == 0);
  }
}

TEST_CASE("weight cache: tensor parallel engine attaches one holder per rank") {
  TempDir dir;
  const std::string model = wsup::test::TestData("llama-tiny-f32");
  Proc h0 = wsup::test::StartHolder(dir, model, dir.Join("r0.sock"), {"--tp-size", "2", "--tp-rank", "0"}, "h0.log");
  Proc h1 = wsup::test::StartHolder(dir, model, dir.Join("r1.sock"), {"--tp-size", "2", "--tp-rank", "1"}, "h1.log");
  REQUIRE(h0.ready);
  REQUIRE(h1.ready);
  Proc e = wsup::test::StartEngine(
      dir, "llama-tiny-f32",
      {"--tp", "2", "--weight-cache", "daemon", "--socket", dir.Join("r0.sock") + "," + dir.Join("r1.sock")});
  INFO(e.Log());
  REQUIRE(e.ready);
  CHECK(wsup::test::GetJson(e.port, "/wsup/status")["weights"]["source"] == "holder");
  CHECK(wsup::test::AllOutputs(e.port, "llama-tiny-f32") == wsup::test::GoldenOutputs("llama-tiny-f32"));

  // Ranks swapped: each holder has the other rank's shard.
  auto swapped = wsup::test::Run({wsup::test::BinPath("wsup-engine"), "--model", model, "--port", "0", "--tp", "2",
                                  "--kv-cache-mib", "4", "--weight-cache", "daemon", "--socket",
                                  dir.Join("r1.sock") + "," + dir.Join("r0.sock")},
                                 60s);
  CHECK(swapped.exit_code == 78);
  CHECK(swapped.output.find("tp_rank") != std::string::npos);
}

TEST_CASE("weight cache: client mode without a holder loads from disk and says why - daemon mode exits") {
  TempDir dir;
  const std::string sock = dir.Join("absent.sock");
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--weight-cache", "client", "--socket", sock});
  INFO(e.Log());
  REQUIRE(e.ready);
  json st = wsup::test::GetJson(e.port, "/wsup/status");
  CHECK(st["weights"]["mode"] == "client");
  CHECK(st["weights"]["source"] == "disk");
  CHECK(st["weights"]["miss_reason"].get<std::string>().find("holder unavailable") != std::string::npos);
  CHECK(wsup::test::AllOutputs(e.port, "llama-tiny-f32") == wsup::test::GoldenOutputs("llama-tiny-f32"));

  auto d = wsup::test::Run({wsup::test::BinPath("wsup-engine"), "--model", wsup::test::TestData("llama-tiny-f32"),
                            "--port", "0", "--kv-cache-mib", "4", "--weight-cache", "daemon", "--socket", sock},
                           60s);
  INFO(d.output);
  CHECK(d.exit_code == 1);
  CHECK(d.output.find("absent.sock") != std::string::npos);
}

TEST_CASE("weight cache: a fingerprint mismatch is fatal in daemon mode and a miss in client mode") {
  TempDir dir;
  const std::string model = wsup::test::TestData("llama-tiny-f32");
  const std::string sock = dir.Join("h.sock");
  Proc holder = wsup::test::StartHolder(dir, model, sock, {"--revision", "r1"});
  REQUIRE(holder.ready);
  auto d = wsup::test::Run({wsup::test::BinPath("wsup-engine"), "--model", model, "--port", "0", "--kv-cache-mib",
                            "4", "--weight-cache", "daemon", "--socket", sock, "--revision", "r2"},
                           60s);
  INFO(d.output);
  CHECK(d.exit_code == 78);
  CHECK(d.output.find("revision") != std::string::npos);

  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32",
                                   {"--weight-cache", "client", "--socket", sock, "--revision", "r2"});
  INFO(e.Log());
  REQUIRE(e.ready);
  json st = wsup::test::GetJson(e.port, "/wsup/status");
  CHECK(st["weights"]["source"] == "disk");
  CHECK(st["weights"]["miss_reason"].get<std::string>().find("fingerprint mismatch") != std::string::npos);
  REQUIRE(st["weights"]["diffs"].is_array());
  CHECK(st["weights"]["diffs"][0]["field"] == "revision");
  CHECK(st["weights"]["diffs"][0]["ours"] == "r2");
  CHECK(st["weights"]["diffs"][0]["holder"] == "r1");
}

TEST_CASE("weight cache: altered bytes served by the holder change the answers") {
  TempDir dir;
  const std::string copy = dir.Join("model");
  std::filesystem::create_directory(copy);
  for (const char* f : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(wsup::test::TestData("llama-tiny-f32") + "/" + f, copy + "/" + f);
  }
  {
    // Negate one tensor in place: flip the sign bit of every float32.
    auto ckpt = wsup::Checkpoint::Open(copy);
    REQUIRE(ckpt.ok());
    const wsup::TensorInfo* t = ckpt->Find("model.layers.1.mlp.down_proj.weight");
    REQUIRE(t != nullptr);
    std::vector<uint8_t> bytes(t->nbytes);
    REQUIRE(ckpt->ReadTensor(*t, bytes.data()).ok());
    for (size_t i = 3; i < bytes.size(); i += 4) bytes[i] ^= 0x80;
    int fd = ::open((copy + "/model.safetensors").c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(t->offset)) ==
            static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  const std::string sock = dir.Join("h.sock");
  Proc holder = wsup::test::StartHolder(dir, copy, sock);
  INFO(holder.Log());
  REQUIRE(holder.ready);
  std::vector<std::string> argv = {wsup::test::BinPath("wsup-engine"), "--model", copy, "--port", "0",
                                   "--ready-fd", "3", "--kv-cache-mib", "4", "--weight-cache", "daemon",
                                   "--socket", sock};
  Proc e = wsup::test::StartWithReadyFd(argv, dir.Join("engine.log"));
  INFO(e.Log());
  REQUIRE(e.ready);
  CHECK(wsup::test::GetJson(e.port, "/wsup/status")["weights"]["source"] == "holder");
  auto outputs = wsup::test::AllOutputs(e.port, "llama-tiny-f32");
  auto goldens = wsup::test::GoldenOutputs("llama-tiny-f32");
  REQUIRE(outputs.size() == goldens.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    CHECK(outputs[i].size() == 16);
    CHECK(outputs[i] != goldens[i]);
  }
}
