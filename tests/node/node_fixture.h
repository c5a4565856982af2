// The end-to-end suites' node (tests/node, tests/chaos): testkit/node.h
// with its defaults (the probe every kProbeMs, three failures to trip), and
// what these suites share besides: the golden answer, a completion through
// the front, the ledger's rows.
#pragma once

#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "testkit/http_client.h"
#include "testkit/node.h"
#include "testkit/sanitized.h"
#include "testkit/test_util.h"

namespace wsup::nodetest {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr bool kSanitizedNode = WSUP_TEST_SANITIZED != 0;
constexpr int kProbeMs = test::kNodeProbeMs;

inline const std::vector<int> kGolden = {92, 16, 97, 246, 28, 201, 169, 207, 160, 234, 48, 216, 188, 48, 232, 118};

inline std::vector<int> GoldenIds() {
  auto g = json::parse(test::ReadAll(test::TestData("llama-tiny-f32/golden.json")));
  return g["cases"][0]["output_ids"].get<std::vector<int>>();
}

// A node on config/demo.toml with these sets last, on the tiny checkpoint
// unless `model` (a path) is given.
class Node : public test::Node {
 public:
  explicit Node(std::vector<std::string> extra_sets = {}, std::string model = "")
      : test::Node(Spec(std::move(extra_sets), std::move(model))) {}

 private:
  static test::NodeSpec Spec(std::vector<std::string> sets, std::string model) {
    test::NodeSpec spec;
    spec.sets = std::move(sets);
    if (!model.empty()) spec.model = std::move(model);
    return spec;
  }
};

// A greedy completion through the front: the generated ids, or empty.
inline std::vector<int> Complete(int port, const std::string& prompt = "Hello, world") {
  json req{{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"return_token_ids", true}};
  auto r = test::HttpRequestOnce(port, "POST", "/v1/completions", req.dump(), 20s,
                                 {{"Content-Type", "application/json"}});
  if (r.status != 200) return {};
  try {
    return json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int>>();
  } catch (...) {
    return {};
  }
}

struct Rows {
  std::vector<std::map<std::string, std::string>> rows;
  // One line per row, "col=value col=value", for test messages.
  std::string Dump() const {
    std::string out;
    for (const auto& r : rows) {
      for (const auto& [k, v] : r) out += k + "=" + v + " ";
      out += "\n";
    }
    return out;
  }
};

inline Rows Query(const std::string& db, const std::string& sql) {
  Rows out;
  sqlite3* h = nullptr;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) return out;
  sqlite3_busy_timeout(h, 2000);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) {
      std::map<std::string, std::string> row;
      for (int i = 0; i < sqlite3_column_count(st); ++i) {
        auto* t = sqlite3_column_text(st, i);
        row[sqlite3_column_name(st, i)] = t ? reinterpret_cast<const char*>(t) : "";
      }
      out.rows.push_back(row);
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(h);
  return out;
}

inline bool Have() {
  if (!test::HaveTestData("llama-tiny-f32")) {
    WARN("SKIP: testdata/llama-tiny-f32 is missing");
    return false;
  }
  return true;
}

// Whether this test is skipped, saying so, for want of root (to do `what`).
inline bool SkipWithoutRoot(const char* what) {
  if (::geteuid() == 0) return false;
  WARN("SKIP: needs root " << what);
  return true;
}

}  // namespace wsup::nodetest
