// The CUDA path's routing decision (engine/cuda/routing.h), run on the CPU:
// hand-made cases for each rule (softmax top-k, ties to the lower id,
// norm_topk_prob, sigmoid scores, groups ranked by their two best biased
// scores, the bias choosing but not weighting, routed_scaling_factor), and
// random logits with many ties against a reference written the way the CPU
// model routes (stable sorts).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "engine/cuda/routing.h"

using wsup::engine::cuda::DevRouting;
using wsup::engine::cuda::RouteToken;

namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed Route(const std::vector<float>& logits, const std::vector<float>& bias, const DevRouting& r) {
  std::vector<float> prob(static_cast<size_t>(r.experts)), choice(prob.size());
  std::unique_ptr<bool[]> taken(new bool[prob.size()]);
  Routed out;
  out.ids.resize(static_cast<size_t>(r.top_k));
  out.weights.resize(out.ids.size());
  RouteToken(logits.data(), bias.data(), r, prob.data(), choice.data(), taken.get(), out.ids.data(),
             out.weights.data());
  return out;
}

// The CPU model's way (engine/model.cc, RankModel::Experts).
Routed Reference(const std::vector<float>& lg, const std::vector<float>& bias, const DevRouting& r) {
  const size_t E = static_cast<size_t>(r.experts);
  std::vector<float> prob(E), choice(E);
  auto top = [&](const std::vector<float>& v, size_t n) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] > v[b]; });
    idx.resize(n);
    return idx;
  };
  if (!r.sigmoid) {
    const float mx = *std::max_element(lg.begin(), lg.end());
    float sum = 0;
    for (size_t e = 0; e < E; ++e) sum += (prob[e] = std::exp(lg[e] - mx));
    for (size_t e = 0; e < E; ++e) choice[e] = prob[e] /= sum;
  } else {
    for (size_t e = 0; e < E; ++e) {
      prob[e] = 1.0f / (1.0f + std::exp(-lg[e]));
      choice[e] = prob[e] + bias[e];
    }
    const size_t G = static_cast<size_t>(r.n_group), per = E / G;
    std::vector<float> gscore(G);
    for (size_t g = 0; g < G; ++g) {
      std::vector<float> part(choice.begin() + static_cast<std::ptrdiff_t>(g * per),
                              choice.begin() + static_cast<std::ptrdiff_t>((g + 1) * per));
      std::sort(part.begin(), part.end(), std::greater<float>());
      gscore[g] = part[0] + part[1];
    }
    std::vector<bool> keep(G, false);
    for (size_t g : top(gscore, static_cast<size_t>(r.topk_group))) keep[g] = true;
    for (size_t e = 0; e < E; ++e) {
      if (!keep[e / per]) choice[e] = 0.0f;
    }
  }
  Routed out;
  float wsum = 0;
  for (size_t e : top(choice, static_cast<size_t>(r.top_k))) {
    out.ids.push_back(static_cast<int32_t>(e));
    wsum += prob[e];
  }
  if (r.sigmoid) wsum += 1e-20f;
  for (int32_t e : out.ids) {
    float w = prob[static_cast<size_t>(e)];
    if (r.norm_topk) w /= wsum;
    out.weights.push_back(w * r.routed_scale);
  }
  return out;
}

DevRouting Softmax(int64_t experts, int64_t k, bool norm) {
  return {.experts = experts, .top_k = k, .norm_topk = norm};
}

DevRouting Sigmoid(int64_t experts, int64_t k, int64_t groups, int64_t keep, float scale) {
  return {.experts = experts,
          .top_k = k,
          .sigmoid = true,
          .n_group = groups,
          .topk_group = keep,
          .norm_topk = true,
          .routed_scale = scale};
}

float Sig(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

TEST_CASE("cuda routing: softmax top-k, ties to the lower id, norm_topk_prob on and off", "[moe]") {
  const std::vector<float> lg = {1.0f, 3.0f, 2.0f, 3.0f};
  auto n = Route(lg, {}, Softmax(4, 2, true));
  CHECK(n.ids == std::vector<int32_t>{1, 3});
  CHECK(n.weights[0] == Approx(0.5f));
  CHECK(n.weights[1] == Approx(0.5f));
  auto raw = Route(lg, {}, Softmax(4, 3, false));
  CHECK(raw.ids == std::vector<int32_t>{1, 3, 2});
  const float z = std::exp(-2.0f) + 2 * 1.0f + std::exp(-1.0f);
  CHECK(raw.weights[0] == Approx(1.0f / z));
  CHECK(raw.weights[2] == Approx(std::exp(-1.0f) / z));
}

TEST_CASE("cuda routing: sigmoid groups ranked by their two best scores, the bias chooses but does not weigh",
          "[moe]") {
  // Group 0 has the single best expert, group 1 the best pair: group 1 wins.
  std::vector<float> lg = {5, -5, -5, -5, 2, 2, -5, -5};
  std::vector<float> bias(8, 0.0f);
  auto a = Route(lg, bias, Sigmoid(8, 2, 2, 1, 2.5f));
  CHECK(a.ids == std::vector<int32_t>{4, 5});
  CHECK(a.weights[0] == Approx(1.25f));
  CHECK(a.weights[1] == Approx(1.25f));
  // A bias lifts expert 6 to the top of its group; its weight stays its own
  // (small) score, normalised over the chosen ones.
  bias[6] = 10.0f;
  auto b = Route(lg, bias, Sigmoid(8, 2, 2, 1, 1.0f));
  CHECK(b.ids == std::vector<int32_t>{6, 4});
  CHECK(b.weights[0] == Approx(Sig(-5) / (Sig(-5) + Sig(2))));
  CHECK(b.weights[1] == Approx(Sig(2) / (Sig(-5) + Sig(2))));
  // Both groups kept: the best two overall.
  bias[6] = 0.0f;
  auto c = Route(lg, bias, Sigmoid(8, 2, 2, 2, 1.0f));
  CHECK(c.ids == std::vector<int32_t>{0, 4});
}

TEST_CASE("cuda routing: equals the CPU model's stable-sort routing on random logits with ties", "[moe]") {
  std::mt19937 rng(14);
  // Logits on a coarse grid, so that ties (in scores and in group sums) are common.
  std::uniform_int_distribution<int> grid(-4, 4);
  int differ = 0, cases = 0;
  for (const DevRouting& r : {Softmax(8, 2, true), Softmax(16, 4, false), Softmax(64, 8, true),
                              Sigmoid(8, 2, 2, 1, 2.5f), Sigmoid(16, 4, 4, 2, 1.0f), Sigmoid(64, 8, 8, 4, 2.5f)}) {
    for (int i = 0; i < 200; ++i) {
      std::vector<float> lg(static_cast<size_t>(r.experts)), bias(lg.size());
      for (auto& v : lg) v = 0.5f * static_cast<float>(grid(rng));
      for (auto& v : bias) v = r.sigmoid ? 0.25f * static_cast<float>(grid(rng)) : 0.0f;
      auto got = Route(lg, bias, r);
      auto want = Reference(lg, bias, r);
      ++cases;
      if (got.ids != want.ids || got.weights != want.weights) {
        ++differ;
        INFO("experts " << r.experts << " top_k " << r.top_k << " sigmoid " << r.sigmoid << " case " << i);
        CHECK(got.ids == want.ids);
        CHECK(got.weights == want.weights);
      }
    }
  }
  CHECK(cases == 1200);
  CHECK(differ == 0);
}
