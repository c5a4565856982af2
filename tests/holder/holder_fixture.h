// Helpers for the holder server tests: start a real wsup-holder, wait for
// its readiness line on a pipe, and read the test checkpoints' tensors.json.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/fingerprint.h"
#include "client/client.h"
#include "common/sha256.h"
#include "tests/text_check.h"
#include "testkit/test_util.h"

namespace wsup::test {

struct HolderProcess {
  Child child;
  std::string socket;
  std::string log;
  int ready_read = -1;  // read end of the readiness pipe
  std::string ready_line;

  HolderProcess() = default;
  HolderProcess(HolderProcess&& o) noexcept
      : child(std::move(o.child)),
        socket(std::move(o.socket)),
        log(std::move(o.log)),
        ready_read(std::exchange(o.ready_read, -1)),
        ready_line(std::move(o.ready_line)) {}
  HolderProcess& operator=(HolderProcess&&) = delete;
  ~HolderProcess() {
    if (ready_read >= 0) ::close(ready_read);
  }

  // Waits until the holder wrote its readiness line or exited.
  bool WaitReady(std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    WaitFor(
        [&] {
          char buf[256];
          ssize_t n = ::read(ready_read, buf, sizeof(buf));
          if (n > 0) ready_line.append(buf, static_cast<size_t>(n));
          return ready_line.find('\n') != std::string::npos || !child.running();
        },
        limit);
    return ready_line == "ready " + socket + "\n";
  }
  std::string Log() const { return ReadAll(log); }
};

// Starts build/bin/wsup-holder with --socket <dir>/<name>.sock, the given
// arguments, and --ready-fd on a pipe. inherit_fds become fds 3, 4, ...; the
// readiness pipe comes after them.
inline HolderProcess StartHolder(const TempDir& dir, const std::string& name, std::vector<std::string> args,
                                 const std::vector<int>& inherit_fds = {}) {
  HolderProcess h;
  h.socket = dir.Join(name + ".sock");
  std::string log_name = name;
  std::replace(log_name.begin(), log_name.end(), '/', '_');
  h.log = dir.Join(log_name + ".log");
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) std::abort();
  std::vector<int> fds = inherit_fds;
  fds.push_back(p[1]);
  std::vector<std::string> argv = {BinPath("wsup-holder"), "--socket", h.socket, "--ready-fd",
                                   std::to_string(3 + inherit_fds.size())};
  argv.insert(argv.end(), args.begin(), args.end());
  h.child = Child::Start(argv, h.log, fds);
  ::close(p[1]);
  ::fcntl(p[0], F_SETFL, O_NONBLOCK);
  h.ready_read = p[0];
  return h;
}

// A daemon-mode attach to holder h as client `name`.
inline AttachOptions DaemonAttach(const HolderProcess& h, const std::string& name, int timeout_ms) {
  AttachOptions o;
  o.socket_path = h.socket;
  o.mode = AttachMode::kDaemon;
  o.client_name = name;
  o.timeout_ms = timeout_ms;
  return o;
}

// The fingerprint of a test engine's layout `layout` (EngineLayoutId
// test-engine/1/<layout>) of checkpoint `checkpoint` at `revision`, with
// the keys in `more` set too.
inline Fingerprint TestLayoutFp(const std::string& checkpoint, const std::string& revision, const std::string& layout,
                                const std::map<std::string, std::string>& more) {
  Fingerprint fp;
  fp.Set("checkpoint", checkpoint);
  fp.Set("revision", revision);
  for (const auto& [k, v] : more) fp.Set(k, v);
  AddEngineLayout(&fp, EngineLayoutId{"test-engine", "1", layout});
  return fp;
}

struct ExpectedTensor {
  std::string dtype;  // as tensors.json spells it ("float32", "bfloat16", ...)
  std::vector<int64_t> shape;
  std::string sha256;
};

inline std::map<std::string, ExpectedTensor> ReadTensorsJson(const std::string& model) {
  std::ifstream in(TestData(model) + "/tensors.json");
  nlohmann::json j = nlohmann::json::parse(in);
  std::map<std::string, ExpectedTensor> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    out[it.key()] = ExpectedTensor{(*it)["dtype"].get<std::string>(),
                                   (*it)["shape"].get<std::vector<int64_t>>(),
                                   (*it)["sha256"].get<std::string>()};
  }
  return out;
}

// The fingerprint an engine on this host computes for a checkpoint folder.
inline Fingerprint EngineFingerprint(const std::string& model_dir, int tp_size = 1, int tp_rank = 0,
                                     const std::string& backend = "host", int device = 0,
                                     const std::string& revision = "") {
  auto in = LocalFingerprintInputs(model_dir, revision, ShardSpec{tp_size, tp_rank}, backend, device);
  if (!in.ok()) throw std::runtime_error(in.error().ToString());
  auto fp = ComputeFingerprint(model_dir, *in);
  if (!fp.ok()) throw std::runtime_error(fp.error().ToString());
  return *fp;
}

// Copies a checkpoint folder (files only) into dst.
inline void CopyCheckpoint(const std::string& src, const std::string& dst) {
  std::filesystem::create_directories(dst);
  for (const auto& e : std::filesystem::directory_iterator(src)) {
    std::filesystem::copy_file(e.path(), dst + "/" + e.path().filename().string(),
                               std::filesystem::copy_options::overwrite_existing);
  }
}

}  // namespace wsup::test
