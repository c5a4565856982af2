// The golden cases of a test checkpoint (golden.json, computed by
// transformers) and the top-5 of a logits row, for the model tests on the
// CPU and on the GPU.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "testkit/test_util.h"

namespace wsup::test {

struct Golden {
  std::string prompt;
  std::vector<int> prompt_ids, output_ids, top5;
  std::vector<float> first8;
  // The smallest top-1/top-2 logit gap over the case's steps.
  double margin = 1.0;
};

inline std::vector<Golden> LoadGolden(const std::string& model) {
  auto text = ReadFile(TestData(model) + "/golden.json");
  REQUIRE(text.ok());
  auto j = nlohmann::json::parse(*text);
  std::vector<Golden> out;
  for (const auto& c : j["cases"]) {
    Golden g;
    g.prompt = c["prompt"];
    g.prompt_ids = c["prompt_ids"].get<std::vector<int>>();
    g.output_ids = c["output_ids"].get<std::vector<int>>();
    // The fp8 golden has outputs only.
    if (c.contains("last_prompt_logits_top5")) g.top5 = c["last_prompt_logits_top5"].get<std::vector<int>>();
    if (c.contains("last_prompt_logits_first8")) g.first8 = c["last_prompt_logits_first8"].get<std::vector<float>>();
    if (c.contains("min_top1_top2_margin")) g.margin = c["min_top1_top2_margin"].get<double>();
    out.push_back(g);
  }
  return out;
}

inline std::vector<int> Top5(const std::vector<float>& logits) {
  std::vector<int> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  idx.resize(5);
  return idx;
}

}  // namespace wsup::test
