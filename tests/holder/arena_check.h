// Checks of a mapped arena against a test checkpoint's tensors.json, for the
// arena tests (tests/holder) and the mapping tests (tests/client).
#pragma once

#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/mapping.h"
#include "common/fs.h"
#include "common/sha256.h"
#include "holder/arena.h"
#include "testkit/test_util.h"

namespace wsup::test {

// name -> sha256 from the test checkpoint's tensors.json.
inline std::map<std::string, std::string> Hashes(const std::string& name) {
  auto text = ReadFile(TestData(name) + "/tensors.json");
  REQUIRE(text.ok());
  auto j = nlohmann::json::parse(*text);
  std::map<std::string, std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = it.value()["sha256"].get<std::string>();
  return out;
}

// The arena mapped a second time, from duplicates of its fds.
inline MappedArena MapDups(const Arena& a) {
  auto fds = a.DupFds();
  REQUIRE(fds.ok());
  auto m = MappedArena::Map(a.manifest(), std::move(*fds));
  if (!m.ok()) FAIL(m.error().ToString());
  return std::move(*m);
}

// Every tensor of m is one of the checkpoint's, found by name, with the
// checkpoint's bytes: read through CopyToHost (host and cuda), and on a host
// arena also at the mapped pointer itself.
inline void CheckHashes(const MappedArena& m, const std::string& name) {
  auto want = Hashes(name);
  REQUIRE(m.size() == want.size());
  std::vector<uint8_t> buf;
  for (const auto& e : m.manifest().entries) {
    INFO(name << ": " << e.name);
    auto v = m.Find(e.name);
    REQUIRE(v.entry == &e);
    REQUIRE(v.data != nullptr);
    REQUIRE(want.count(e.name) == 1);
    buf.resize(e.nbytes);
    REQUIRE(m.CopyToHost(e, buf.data()).ok());
    CHECK(Sha256Hex(buf.data(), buf.size()) == want[e.name]);
    if (!m.is_cuda()) CHECK(Sha256Hex(v.data, e.nbytes) == want[e.name]);
  }
}

}  // namespace wsup::test
