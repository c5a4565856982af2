// The holder end to end, with real processes: build/bin/wsup-holder serves,
// the test process (a second process) attaches through the C++ client and
// the C ABI, and every byte is checked against the sha256 in tensors.json.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "client/client.h"
#include "client/wsup_client.h"
#include "gpu/cuda_driver.h"
#include "supervisor/cache_commands.h"
#include "tests/holder/holder_fixture.h"
#include "tests/holder/manifest_table_check.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using test::HolderProcess, test::StartHolder, test::TempDir;

std::string SafetensorsDtype(const std::string& torch_name) {
  if (torch_name == "float32") return "F32";
  if (torch_name == "bfloat16") return "BF16";
  if (torch_name == "float16") return "F16";
  if (torch_name == "float8_e4m3fn") return "F8_E4M3";
  return "?" + torch_name;
}

// Checks that every tensor of tensors.json is resident with the right
// dtype, shape and bytes. For a cuda arena the bytes are copied to the host.
// A kept arena's fds as a restarted holder inherits them: their numbers
// here, and "3,4,..." (what they become in the child) for --adopt-fds.
std::pair<std::vector<int>, std::string> AdoptFds(const KeptArena& kept) {
  std::vector<int> fds;
  std::string list;
  for (size_t i = 0; i < kept.fds.size(); ++i) {
    fds.push_back(kept.fds[i].get());
    if (i) list += ',';  // not `(i ? "," : "") + ...`: GCC 12 -O3 gives a false -Wrestrict error on that
    list += std::to_string(3 + i);
  }
  return {fds, list};
}

void CheckAllTensors(const Attachment& a, const std::string& model) {
  auto expected = test::ReadTensorsJson(model);
  REQUIRE(a.size() == expected.size());
  for (const auto& [name, want] : expected) {
    INFO(model << ": " << name);
    TensorView v = a.Find(name);
    REQUIRE(v.entry != nullptr);
    REQUIRE(v.data != nullptr);
    CHECK(v.entry->dtype == SafetensorsDtype(want.dtype));
    CHECK(v.entry->shape == want.shape);
    std::vector<uint8_t> bytes(v.entry->nbytes);
    REQUIRE(a.arena().CopyToHost(*v.entry, bytes.data()).ok());
    CHECK(Sha256Hex(bytes.data(), bytes.size()) == want.sha256);
    if (!a.arena().is_cuda()) {
      // Host arenas: the mapped pointer itself holds the bytes.
      CHECK(Sha256Hex(v.data, v.entry->nbytes) == want.sha256);
    }
  }
  CHECK(a.Find("no.such.tensor").entry == nullptr);
}

AttachOptions Daemon(const std::string& socket) {
  AttachOptions o;
  o.socket_path = socket;
  o.mode = AttachMode::kDaemon;
  o.client_name = "test-engine";
  return o;
}

bool HaveCudaDevice(std::string* why) {
  if (!cuda::BuiltWithCuda()) {
    *why = "built without the CUDA toolkit";
    return false;
  }
  Status s = cuda::Init();
  if (!s.ok()) {
    *why = s.error().message();
    return false;
  }
  auto n = cuda::DeviceCount();
  if (!n.ok() || *n == 0) {
    *why = "no CUDA device is visible";
    return false;
  }
  return true;
}

TEST_CASE("a holder serves every tensor to a second process, byte for byte (host)", "[holder][server]") {
  for (std::string model : {"llama-tiny-f32", "llama-tiny-bf16-sharded", "llama-tiny-fp8-block"}) {
    SECTION(model) {
      TempDir dir;
      std::string path = test::TestData(model);
      HolderProcess h = StartHolder(dir, "h", {"--model", path, "--deployment", "unit", "--backend", "host"});
      REQUIRE(h.WaitReady());

      // The C++ client, daemon mode.
      auto r = Attach(Daemon(h.socket), test::EngineFingerprint(path));
      REQUIRE(r.ok());
      REQUIRE(r->outcome.source == WeightSource::kHolder);
      CHECK(r->outcome.reason.empty());
      CHECK(r->outcome.ms > 0);
      CheckAllTensors(*r->attachment, model);

      // The C ABI, from the checkpoint folder.
      wsup_attachment* c = wsup_attach(h.socket.c_str(), "daemon", nullptr, path.c_str(),
                                       R"({"client_name": "c-abi", "timeout_ms": 5000})");
      REQUIRE(c != nullptr);
      INFO(wsup_error(c));
      REQUIRE(wsup_status(c) == WSUP_OK);
      CHECK(wsup_from_holder(c) == 1);
      CHECK(std::string(wsup_source(c)) == "holder");
      CHECK(std::string(wsup_reason(c)).empty());
      CHECK(wsup_is_cuda(c) == 0);
      auto expected = test::ReadTensorsJson(model);
      REQUIRE(wsup_num_tensors(c) == expected.size());
      size_t seen = 0;
      for (size_t i = 0; i < wsup_num_tensors(c); ++i) {
        const char* name = wsup_tensor_name(c, i);
        REQUIRE(name != nullptr);
        auto it = expected.find(name);
        REQUIRE(it != expected.end());
        ++seen;
        CHECK(std::string(wsup_tensor_dtype(c, name)) == SafetensorsDtype(it->second.dtype));
        REQUIRE(wsup_tensor_ndim(c, name) == static_cast<int>(it->second.shape.size()));
        for (int d = 0; d < wsup_tensor_ndim(c, name); ++d) {
          CHECK(wsup_tensor_dim(c, name, d) == it->second.shape[static_cast<size_t>(d)]);
        }
        CHECK(wsup_tensor_dim(c, name, 99) == -1);
        const void* p = wsup_tensor_data(c, name);
        REQUIRE(p != nullptr);
        CHECK(Sha256Hex(p, wsup_tensor_nbytes(c, name)) == it->second.sha256);
        std::vector<uint8_t> copy(wsup_tensor_nbytes(c, name));
        CHECK(wsup_tensor_copy_to_host(c, name, copy.data(), copy.size()) == WSUP_OK);
        CHECK(Sha256Hex(copy.data(), copy.size()) == it->second.sha256);
        CHECK(wsup_tensor_copy_to_host(c, name, copy.data(), copy.size() - 1) == WSUP_ERR_INVALID_ARGUMENT);
      }
      CHECK(seen == expected.size());
      CHECK(wsup_tensor_name(c, expected.size()) == nullptr);
      CHECK(wsup_tensor_data(c, "no.such.tensor") == nullptr);
      CHECK(wsup_tensor_ndim(c, "no.such.tensor") == -1);
      CHECK(wsup_tensor_copy_to_host(c, "no.such.tensor", nullptr, 0) == WSUP_ERR_NOT_FOUND);
      // The whole manifest in one block says what the per-tensor calls say.
      CHECK(test::CheckManifestTable(c) == 0);  // checkpoint tensors are contiguous

      // Both attachments are counted, with their roles and pids.
      auto info = QueryHolderInfo(h.socket, 5000);
      REQUIRE(info.ok());
      CHECK(info->clients == 2);
      CHECK(info->tensors == expected.size());
      CHECK(info->backend == "host");
      CHECK(info->deployment == "unit");
      CHECK_FALSE(info->adopted);
      int engines = 0;
      for (const auto& e : info->client_list) {
        if (e.attached) {
          CHECK(e.role == "engine");
          CHECK(e.pid == ::getpid());
          ++engines;
        }
      }
      CHECK(engines == 2);

      wsup_detach(c);
      r->attachment->Detach();
      // The holder notices both detaches.
      CHECK(test::WaitFor(
          [&] {
            auto i = QueryHolderInfo(h.socket, 5000);
            return i.ok() && i->clients == 0;
          },
          10s));

      h.child.Kill(SIGTERM);
      CHECK(h.child.Wait(10s) == 0);
      CHECK_FALSE(std::filesystem::exists(h.socket));  // a clean exit removes its socket
    }
  }
}

TEST_CASE("two tensor-parallel holders hold slices that reassemble into the original", "[holder][server][tp]") {
  const std::string model = "llama-tiny-f32";
  std::string path = test::TestData(model);
  TempDir dir;
  HolderProcess h0 = StartHolder(dir, "r0", {"--model", path, "--tp-size", "2", "--tp-rank", "0"});
  HolderProcess h1 = StartHolder(dir, "r1", {"--model", path, "--tp-size", "2", "--tp-rank", "1"});
  REQUIRE(h0.WaitReady());
  REQUIRE(h1.WaitReady());
  auto a0 = Attach(Daemon(h0.socket), test::EngineFingerprint(path, 2, 0));
  auto a1 = Attach(Daemon(h1.socket), test::EngineFingerprint(path, 2, 1));
  REQUIRE(a0.ok());
  REQUIRE(a1.ok());
  REQUIRE(a0->attachment);
  REQUIRE(a1->attachment);

  // A rank-1 engine must not get rank 0's slice.
  auto wrong = Attach(Daemon(h0.socket), test::EngineFingerprint(path, 2, 1));
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().code() == Code::kMismatch);
  CHECK_THAT(wrong.error().message(), Catch::Contains("tp_rank"));

  auto contains = [](const std::string& s, const char* part) { return s.find(part) != std::string::npos; };
  for (const auto& [name, want] : test::ReadTensorsJson(model)) {
    INFO(name);
    TensorView v0 = a0->attachment->Find(name);
    TensorView v1 = a1->attachment->Find(name);
    REQUIRE(v0.entry);
    REQUIRE(v1.entry);
    const auto* p0 = static_cast<const uint8_t*>(v0.data);
    const auto* p1 = static_cast<const uint8_t*>(v1.data);
    std::vector<uint8_t> whole;
    bool cols = contains(name, "o_proj") || contains(name, "down_proj");
    bool rows = contains(name, "q_proj") || contains(name, "k_proj") || contains(name, "v_proj") ||
                contains(name, "gate_proj") || contains(name, "up_proj") || contains(name, "embed_tokens") ||
                contains(name, "lm_head");
    if (rows) {
      CHECK(v0.entry->shape[0] * 2 == want.shape[0]);
      whole.insert(whole.end(), p0, p0 + v0.entry->nbytes);
      whole.insert(whole.end(), p1, p1 + v1.entry->nbytes);
    } else if (cols) {
      REQUIRE(want.shape.size() == 2);
      CHECK(v0.entry->shape[1] * 2 == want.shape[1]);
      size_t row0 = v0.entry->nbytes / static_cast<size_t>(want.shape[0]);
      size_t row1 = v1.entry->nbytes / static_cast<size_t>(want.shape[0]);
      for (int64_t r = 0; r < want.shape[0]; ++r) {
        whole.insert(whole.end(), p0 + r * row0, p0 + (r + 1) * row0);
        whole.insert(whole.end(), p1 + r * row1, p1 + (r + 1) * row1);
      }
    } else {
      // Replicated: both ranks hold the whole tensor.
      CHECK(v0.entry->shape == want.shape);
      CHECK(Sha256Hex(p1, v1.entry->nbytes) == want.sha256);
      whole.assign(p0, p0 + v0.entry->nbytes);
    }
    CHECK(Sha256Hex(whole.data(), whole.size()) == want.sha256);
  }

  // verify knows the slice: each holder checks clean against the full checkpoint.
  for (const HolderProcess* h : {&h0, &h1}) {
    CommandOutput v = CacheVerifyCommand(h->socket, path, /*json=*/true);
    INFO(v.out << v.err);
    CHECK(v.exit_code == 0);
    auto j = nlohmann::json::parse(v.out);
    CHECK(j["verified"] == j["tensors"]);
    CHECK(j["mismatched"].empty());
  }
}

TEST_CASE("a per-tensor FP8 checkpoint is refused, naming the method and mode off", "[holder][server]") {
  TempDir dir;
  HolderProcess h = StartHolder(dir, "h", {"--model", test::TestData("llama-tiny-fp8-pertensor")});
  CHECK_FALSE(h.WaitReady());
  REQUIRE(h.child.Wait(30s) >= 0);
  CHECK(h.child.exit_code() == 3);
  std::string log = h.Log();
  INFO(log);
  CHECK_THAT(log, Catch::Contains("fp8"));
  CHECK_THAT(log, Catch::Contains("`off`"));
  CHECK_THAT(log, Catch::Contains("llama-tiny-fp8-pertensor"));
  CHECK_FALSE(std::filesystem::exists(h.socket));
}

TEST_CASE("every fingerprint field, changed alone, is a mismatch that names it", "[holder][server][modes]") {
  std::string path = test::TestData("llama-tiny-f32");
  TempDir dir;
  HolderProcess h = StartHolder(dir, "h", {"--model", path, "--revision", "r1"});
  REQUIRE(h.WaitReady());
  Fingerprint good = test::EngineFingerprint(path, 1, 0, "host", 0, "r1");
  REQUIRE(good.fields().size() >= 19);

  for (const auto& [field, value] : good.fields()) {
    INFO("field " << field);
    Fingerprint changed = good;
    changed.Set(field, value + "-changed");

    auto d = Attach(Daemon(h.socket), changed);
    REQUIRE_FALSE(d.ok());
    CHECK(d.error().code() == Code::kMismatch);
    CHECK_THAT(d.error().message(), Catch::Contains(field + ": ours=" + value + "-changed holder=" + value));

    AttachOptions co = Daemon(h.socket);
    co.mode = AttachMode::kClient;
    auto c = Attach(co, changed);
    REQUIRE(c.ok());
    CHECK(c->outcome.source == WeightSource::kDisk);
    CHECK(c->attachment == nullptr);
    REQUIRE(c->outcome.diffs.size() == 1);
    CHECK(c->outcome.diffs[0].field == field);
    CHECK(c->outcome.diffs[0].ours == value + "-changed");
    CHECK(c->outcome.diffs[0].theirs == value);
    CHECK_THAT(c->outcome.reason, Catch::Contains("mismatch") && Catch::Contains(field));
  }

  // The unchanged fingerprint attaches in both modes.
  auto ok = Attach(Daemon(h.socket), good);
  REQUIRE(ok.ok());
  CHECK(ok->outcome.source == WeightSource::kHolder);

  // The C ABI reports the same, from a fingerprint JSON.
  Fingerprint bad = good;
  bad.Set("dtype", "float16");
  std::string fp_json = bad.ToJson().dump();
  wsup_attachment* c = wsup_attach(h.socket.c_str(), "client", fp_json.c_str(), nullptr, nullptr);
  REQUIRE(wsup_status(c) == WSUP_OK);
  CHECK(wsup_from_holder(c) == 0);
  CHECK(std::string(wsup_source(c)) == "disk");
  CHECK_THAT(std::string(wsup_reason(c)), Catch::Contains("dtype"));
  auto diffs = nlohmann::json::parse(wsup_diffs_json(c));
  REQUIRE(diffs.size() == 1);
  CHECK(diffs[0]["field"] == "dtype");
  CHECK(diffs[0]["ours"] == "float16");
  CHECK(diffs[0]["holder"] == good.Get("dtype"));
  wsup_detach(c);
  wsup_attachment* d = wsup_attach(h.socket.c_str(), "daemon", fp_json.c_str(), nullptr, nullptr);
  CHECK(wsup_status(d) == WSUP_ERR_MISMATCH);
  CHECK_THAT(std::string(wsup_error(d)), Catch::Contains("dtype"));
  CHECK(wsup_from_holder(d) == 0);
  wsup_detach(d);

  // Mismatches are logged by the holder with the field.
  CHECK_THAT(h.Log(), Catch::Contains("fingerprint mismatch") && Catch::Contains("dtype: ours=float16"));
}

TEST_CASE("mapped weights survive a SIGKILLed holder, and a holder adopted from kept fds serves verify without the "
          "checkpoint",
          "[holder][server][adopt]") {
  const std::string model = "llama-tiny-f32";
  TempDir dir;
  std::string copy = dir.Join("model");
  test::CopyCheckpoint(test::TestData(model), copy);

  HolderProcess first = StartHolder(dir, "h", {"--model", copy, "--deployment", "adopt"});
  REQUIRE(first.WaitReady());
  auto engine = Attach(Daemon(first.socket), test::EngineFingerprint(copy));
  REQUIRE(engine.ok());
  REQUIRE(engine->attachment);
  auto kept = AttachKeeper(first.socket, "test-keeper", 5000);
  REQUIRE(kept.ok());
  REQUIRE(kept->fds.size() == kept->record.manifest.allocations.size());
  std::string record = dir.Join("arena.json");
  REQUIRE(WriteArenaRecord(record, kept->record).ok());

  first.child.Kill(SIGKILL);
  REQUIRE(first.child.Wait(10s) >= 0);
  // The engine's mapping outlives the holder.
  CheckAllTensors(*engine->attachment, model);
  // The keeper's connection tells it the holder is gone.
  auto eof = kept->channel.Receive(5000);
  REQUIRE_FALSE(eof.ok());
  CHECK(eof.error().code() == Code::kUnavailable);

  // The checkpoint goes away (a rename: root could still read a chmod-000 file).
  std::filesystem::rename(copy, dir.Join("moved-away"));
  REQUIRE_FALSE(std::filesystem::exists(copy));

  auto [fd_numbers, fd_list] = AdoptFds(*kept);
  // The same socket path: the dead holder's stale socket file is replaced.
  HolderProcess second =
      StartHolder(dir, "h", {"--adopt-manifest", record, "--adopt-fds", fd_list, "--deployment", "adopt"}, fd_numbers);
  REQUIRE(second.WaitReady());
  std::string log = second.Log();
  CHECK_THAT(log, Catch::Contains("adopted") && Catch::Contains("the checkpoint was not read"));
  CHECK_THAT(log, Catch::Contains("removed stale socket"));

  // The keeper drops its copies: the new holder's fds keep the memory alive.
  kept->fds.clear();

  CommandOutput v = CacheVerifyCommand(second.socket, test::TestData(model), /*json=*/true);
  INFO(v.out << v.err << second.Log());
  REQUIRE(v.exit_code == 0);
  auto j = nlohmann::json::parse(v.out);
  CHECK(j["ok"] == true);
  CHECK(j["tensors"] == 21);
  CHECK(j["verified"] == 21);
  CHECK(j["mismatched"].empty());
  // Another folder holding the same files: reported, not refused.
  REQUIRE(j["fingerprint_diffs"].size() == 1);
  CHECK(j["fingerprint_diffs"][0]["field"] == "model_path");

  auto info = QueryHolderInfo(second.socket, 5000);
  REQUIRE(info.ok());
  CHECK(info->adopted);
  CHECK(info->fingerprint.Get("model_path") == AbsoluteModelPath(copy));

  // An engine with the original fingerprint attaches to the adopted holder.
  auto again = Attach(Daemon(second.socket), engine->attachment->holder_fingerprint());
  REQUIRE(again.ok());
  CheckAllTensors(*again->attachment, model);

  // And the adopted holder never loaded anything (both holders log to one file).
  std::string tag = "wsup-holder[" + std::to_string(second.child.pid()) + "]";
  std::istringstream lines(second.Log());
  int own_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find(tag) == std::string::npos) continue;
    ++own_lines;
    CHECK_THAT(line, !Catch::Contains("loaded "));
  }
  CHECK(own_lines >= 3);
}

TEST_CASE("adopting refuses inconsistent records and fds with a message naming the fix", "[holder][server][adopt]") {
  std::string path = test::TestData("llama-tiny-f32");
  TempDir dir;
  HolderProcess first = StartHolder(dir, "h", {"--model", path});
  REQUIRE(first.WaitReady());
  auto kept = AttachKeeper(first.socket, "test-keeper", 5000);
  REQUIRE(kept.ok());
  std::string record = dir.Join("arena.json");
  REQUIRE(WriteArenaRecord(record, kept->record).ok());
  std::vector<int> fds = {kept->fds[0].get()};

  // fd count differs from the allocations.
  HolderProcess a = StartHolder(dir, "a", {"--adopt-manifest", record, "--adopt-fds", "3,4"}, fds);
  CHECK(a.child.Wait(30s) == 3);
  CHECK_THAT(a.Log(), Catch::Contains("--adopt-fds") && Catch::Contains("one inherited fd per allocation"));

  // A conflicting --tp-rank.
  HolderProcess b = StartHolder(dir, "b", {"--adopt-manifest", record, "--adopt-fds", "3", "--tp-size", "2",
                                           "--tp-rank", "1"}, fds);
  CHECK(b.child.Wait(30s) != 0);
  CHECK_THAT(b.Log(), Catch::Contains("differs from the adopted arena"));

  // A damaged record.
  std::string bad = dir.Join("bad.json");
  std::ofstream(bad) << "{\"format\": \"wsup-arena-record\", \"manifest\": 3}";
  HolderProcess c = StartHolder(dir, "c", {"--adopt-manifest", bad, "--adopt-fds", "3"}, fds);
  CHECK(c.child.Wait(30s) == 3);
  CHECK_THAT(c.Log(), Catch::Contains("bad.json") && Catch::Contains("manifest"));

  // --adopt-fds without --adopt-manifest.
  HolderProcess d = StartHolder(dir, "d", {"--adopt-fds", "3"}, fds);
  CHECK(d.child.Wait(30s) == 2);
  CHECK_THAT(d.Log(), Catch::Contains("--adopt-manifest and --adopt-fds go together"));

  // The first holder kept serving through all of it.
  CHECK(QueryHolderInfo(first.socket, 5000).ok());
}

TEST_CASE("wsup cache info and verify: JSON fields, and exit 1 when a resident tensor differs",
          "[holder][server][cli]") {
  const std::string model = "llama-tiny-bf16-sharded";
  std::string path = test::TestData(model);
  TempDir dir;
  HolderProcess h = StartHolder(dir, "h", {"--model", path, "--deployment", "d1", "--revision", "v7"});
  REQUIRE(h.WaitReady());
  auto engine = Attach(Daemon(h.socket), test::EngineFingerprint(path, 1, 0, "host", 0, "v7"));
  REQUIRE(engine.ok());

  auto info = test::Run({test::BinPath("wsup"), "cache", "info", "--socket", h.socket, "--json"});
  INFO(info.output);
  REQUIRE(info.exit_code == 0);
  auto j = nlohmann::json::parse(info.output);
  for (const char* key : {"fingerprint", "fingerprint_id", "tensors", "bytes", "backend", "allocations", "clients",
                          "client_list", "deployment", "revision", "adopted", "holder_pid"}) {
    CHECK(j.contains(key));
  }
  CHECK(j["tensors"] == 21);
  CHECK(j["backend"] == "host");
  CHECK(j["allocations"].get<int>() >= 1);
  CHECK(j["clients"] == 1);
  CHECK(j["deployment"] == "d1");
  CHECK(j["revision"] == "v7");
  CHECK(j["fingerprint"]["revision"] == "v7");
  CHECK(j["fingerprint"]["checkpoint_files"] == "10");
  CHECK(j["holder_pid"] == h.child.pid());
  uint64_t total = 0;
  for (const auto& [name, t] : test::ReadTensorsJson(model)) {
    uint64_t n = 2;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    total += n;
  }
  CHECK(j["bytes"] == total);

  auto text = test::Run({test::BinPath("wsup"), "cache", "info", "--socket", h.socket});
  CHECK(text.exit_code == 0);
  CHECK_THAT(text.output, Catch::Contains("tensors      21") && Catch::Contains("test-engine"));

  auto verify = test::Run({test::BinPath("wsup"), "cache", "verify", "--socket", h.socket, "--model", path, "--json"});
  INFO(verify.output);
  REQUIRE(verify.exit_code == 0);
  auto v = nlohmann::json::parse(verify.output);
  CHECK(v["tensors"] == 21);
  CHECK(v["verified"] == 21);
  CHECK(v["mismatched"].empty());
  CHECK(v["fingerprint_diffs"].empty());

  // A copy of the checkpoint with one byte of one tensor changed.
  std::string modified = dir.Join("modified");
  test::CopyCheckpoint(path, modified);
  auto ckpt = Checkpoint::Open(modified);
  REQUIRE(ckpt.ok());
  const TensorInfo* t = ckpt->Find("model.layers.1.mlp.down_proj.weight");
  REQUIRE(t);
  {
    std::fstream f(ckpt->files()[static_cast<size_t>(t->file)].path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(t->offset + 10));
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(t->offset + 10));
    f.write(&b, 1);
  }
  auto bad = test::Run({test::BinPath("wsup"), "cache", "verify", "--socket", h.socket, "--model", modified, "--json"});
  INFO(bad.output);
  CHECK(bad.exit_code == 1);
  auto b = nlohmann::json::parse(bad.output);
  CHECK(b["ok"] == false);
  CHECK(b["verified"] == 20);
  REQUIRE(b["mismatched"].size() == 1);
  CHECK(b["mismatched"][0] == "model.layers.1.mlp.down_proj.weight");
  CHECK_THAT(b["details"][0]["reason"].get<std::string>(), Catch::Contains("first at byte 10"));

  auto bad_text = test::Run({test::BinPath("wsup"), "cache", "verify", "--socket", h.socket, "--model", modified});
  CHECK(bad_text.exit_code == 1);
  CHECK_THAT(bad_text.output, Catch::Contains("MISMATCH model.layers.1.mlp.down_proj.weight"));

  // A different checkpoint altogether: every tensor differs (dtype), and
  // the fingerprint differences are listed.
  auto other = test::Run(
      {test::BinPath("wsup"), "cache", "verify", "--socket", h.socket, "--model", test::TestData("llama-tiny-f32"), "--json"});
  CHECK(other.exit_code == 1);
  auto o = nlohmann::json::parse(other.output);
  CHECK(o["mismatched"].size() == 21);
  CHECK_FALSE(o["fingerprint_diffs"].empty());

  // No holder there: exit 2 with the socket named.
  auto none = test::Run({test::BinPath("wsup"), "cache", "info", "--socket", dir.Join("nothing.sock")});
  CHECK(none.exit_code == 2);
  CHECK_THAT(none.output, Catch::Contains("nothing.sock") && Catch::Contains("the holder is not listening"));
  auto none_json = test::Run({test::BinPath("wsup"), "cache", "verify", "--socket", dir.Join("nothing.sock"),
                              "--model", path, "--json"});
  CHECK(none_json.exit_code == 2);
  CHECK(nlohmann::json::parse(none_json.output)["ok"] == false);

  // Usage errors.
  CHECK(test::Run({test::BinPath("wsup"), "cache", "verify", "--socket", h.socket}).exit_code == 2);
  CHECK(test::Run({test::BinPath("wsup"), "cache"}).exit_code == 2);
  CHECK(test::Run({test::BinPath("wsup"), "cache", "info", "--sock", h.socket}).exit_code == 2);
  CHECK(test::Run({test::BinPath("wsup"), "cache", "info", "--help"}).exit_code == 0);
}

TEST_CASE("bad command lines give a clear message and a non-zero exit", "[holder][server][cli]") {
  TempDir dir;
  std::string sock = dir.Join("h.sock");
  std::string model = test::TestData("llama-tiny-f32");
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string says;
  };
  std::vector<Case> cases = {
      {{"--socket", sock}, 2, "--model is required"},
      {{"--socket", sock, "--model", dir.Join("no-such-dir")}, 2, "no-such-dir: no such directory"},
      {{"--socket", sock, "--model", model, "--backend", "tpu"}, 2, "--backend"},
      {{"--socket", sock, "--model", model, "--tp-size", "2", "--tp-rank", "2"}, 2, "--tp-rank 2 is out of range"},
      {{"--socket", sock, "--model", model, "--tp-size", "0"}, 2, "--tp-size 0"},
      {{"--socket", sock, "--model", model, "--read-threads", "0"}, 2, "--read-threads"},
      {{"--socket", sock, "--model", model, "--ready-fd", "77"}, 2, "--ready-fd 77"},
      {{"--socket", sock, "--model", model, "--log-level", "loud"}, 2, "--log-level"},
      {{"--socket", sock, "--model", model, "--adopt-manifest", dir.Join("x.json")}, 2, "go together"},
      {{"--socket", sock, "--model", model, "--adopt-manifest", dir.Join("x.json"), "--adopt-fds", "1"}, 2,
       "--adopt-fds '1'"},
      {{"--model", model}, 2, "--socket"},
      {{"--socket", sock, "--model", dir.path()}, 3, "config.json"},
      {{"--socket", "/tmp/h.sock", "--model", model}, 1, "chmod 700 /tmp"},
      {{"--socket", dir.Join(std::string(120, 'x')), "--model", model}, 1, "longer than"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {test::BinPath("wsup-holder")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = test::Run(argv, 30s);
    INFO(r.output);
    CHECK(r.exit_code == c.exit_code);
    CHECK_THAT(r.output, Catch::Contains(c.says));
  }
  CHECK(test::Run({test::BinPath("wsup-holder"), "--help"}).exit_code == 0);

  // A socket path that exists and is not a socket is left alone.
  std::string file = dir.Join("plain-file");
  std::ofstream(file) << "x";
  auto r = test::Run({test::BinPath("wsup-holder"), "--socket", file, "--model", model}, 30s);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("is not a socket"));
  CHECK(test::ReadAll(file) == "x");
}

TEST_CASE("a second holder on a live socket is refused, the first keeps serving", "[holder][server]") {
  std::string model = test::TestData("llama-tiny-f32");
  TempDir dir;
  HolderProcess a = StartHolder(dir, "h", {"--model", model});
  REQUIRE(a.WaitReady());
  HolderProcess b = StartHolder(dir, "h", {"--model", model});
  CHECK_FALSE(b.WaitReady());
  CHECK(b.child.Wait(30s) == 1);
  CHECK_THAT(b.Log(), Catch::Contains("another holder is serving"));
  CHECK(QueryHolderInfo(a.socket, 5000).ok());

  // The directory and socket modes the holder set up.
  struct stat st{};
  REQUIRE(::stat(a.socket.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  // A missing socket directory is created private.
  TempDir fresh;
  HolderProcess c = StartHolder(fresh, "run/wsup/h", {"--model", model});
  REQUIRE(c.WaitReady());
  REQUIRE(::stat(fresh.Join("run/wsup").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
}

TEST_CASE("cuda backend: a holder serves device memory that a second process maps", "[holder][server][gpu]") {
  std::string why;
  if (!HaveCudaDevice(&why)) {
    WARN("SKIP [gpu]: " << why);
    return;
  }
  for (std::string model : {"llama-tiny-f32", "llama-tiny-fp8-block"}) {
    SECTION(model) {
      std::string path = test::TestData(model);
      TempDir dir;
      HolderProcess h = StartHolder(dir, "h", {"--model", path, "--backend", "cuda", "--device", "0"});
      REQUIRE(h.WaitReady(60s));
      auto r = Attach(Daemon(h.socket), test::EngineFingerprint(path, 1, 0, "cuda", 0));
      REQUIRE(r.ok());
      REQUIRE(r->attachment);
      CHECK(r->attachment->arena().is_cuda());
      CheckAllTensors(*r->attachment, model);

      wsup_attachment* c = wsup_attach(h.socket.c_str(), "daemon", nullptr, path.c_str(), R"({"backend": "cuda"})");
      INFO(wsup_error(c));
      REQUIRE(wsup_status(c) == WSUP_OK);
      CHECK(wsup_is_cuda(c) == 1);
      CHECK(test::CheckManifestTable(c) == 0);  // device pointers, as wsup_tensor_data gives them
      wsup_detach(c);

      // A host engine does not match a cuda holder: the backend differs.
      auto host = Attach(Daemon(h.socket), test::EngineFingerprint(path));
      REQUIRE_FALSE(host.ok());
      CHECK_THAT(host.error().message(), Catch::Contains("backend"));

      CommandOutput v = CacheVerifyCommand(h.socket, path, true);
      INFO(v.out << v.err);
      CHECK(v.exit_code == 0);

      // The holder dies; the device mapping stays readable.
      h.child.Kill(SIGKILL);
      h.child.Wait(10s);
      CheckAllTensors(*r->attachment, model);
    }
  }
}

TEST_CASE("cuda backend: a keeper's fds outlive the holder and seed an adopted one", "[holder][server][gpu][adopt]") {
  std::string why;
  if (!HaveCudaDevice(&why)) {
    WARN("SKIP [gpu]: " << why);
    return;
  }
  const std::string model = "llama-tiny-f32";
  TempDir dir;
  std::string copy = dir.Join("model");
  test::CopyCheckpoint(test::TestData(model), copy);
  HolderProcess first = StartHolder(dir, "h", {"--model", copy, "--backend", "cuda"});
  REQUIRE(first.WaitReady(60s));
  auto kept = AttachKeeper(first.socket, "keeper", 5000);
  REQUIRE(kept.ok());
  std::string record = dir.Join("arena.json");
  REQUIRE(WriteArenaRecord(record, kept->record).ok());
  first.child.Kill(SIGKILL);
  first.child.Wait(10s);
  std::filesystem::rename(copy, dir.Join("gone"));
  auto [fds, list] = AdoptFds(*kept);
  HolderProcess second = StartHolder(dir, "h", {"--adopt-manifest", record, "--adopt-fds", list}, fds);
  REQUIRE(second.WaitReady(60s));
  kept->fds.clear();
  CommandOutput v = CacheVerifyCommand(second.socket, test::TestData(model), true);
  INFO(v.out << v.err << second.Log());
  CHECK(v.exit_code == 0);
}

}  // namespace
}  // namespace wsup
