// The mixture-of-experts routing decision of one token, as the CUDA routing
// kernel makes it (engine/cuda/kernels.cu) and as the CPU model makes it
// (RankModel::Experts in engine/model.cc): Qwen3-MoE's softmax top-k and
// DeepSeek-V3's sigmoid scores with e_score_correction_bias, group-limited
// choice, norm_topk_prob and routed_scaling_factor. It is plain C++ that
// nvcc compiles for the device too, so the CPU tests check the very code
// the GPU runs. Ties go to the lower expert id (a stable sort's order);
// weights are summed in the order the experts were chosen.
#pragma once

#include <math.h>

#include <cstdint>

#include "engine/cuda/kernels.h"

#if defined(__CUDACC__)
#define WSUP_HOST_DEVICE __host__ __device__
#else
#define WSUP_HOST_DEVICE
#endif

namespace wsup::engine::cuda {

// logits: r.experts router outputs; bias: r.experts values (read only when
// r.sigmoid). prob, choice and taken: scratch of r.experts each. ids and
// weights get r.top_k values, the best first.
WSUP_HOST_DEVICE inline void RouteToken(const float* logits, const float* bias, const DevRouting& r, float* prob,
                                        float* choice, bool* taken, int32_t* ids, float* weights) {
  const int64_t E = r.experts, K = r.top_k;
  if (!r.sigmoid) {
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e) mx = fmaxf(mx, logits[e]);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (prob[e] = expf(logits[e] - mx));
    for (int64_t e = 0; e < E; ++e) choice[e] = prob[e] = prob[e] / sum;
  } else {
    for (int64_t e = 0; e < E; ++e) {
      prob[e] = 1.0f / (1.0f + expf(-logits[e]));
      choice[e] = prob[e] + bias[e];
    }
    // Groups ranked by the sum of their two best biased scores; the experts
    // of the groups not kept score 0.
    const int64_t G = r.n_group, per = E / G;
    float gscore[kMaxExperts / 2];
    bool gkeep[kMaxExperts / 2];
    for (int64_t g = 0; g < G; ++g) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        const float c = choice[e];
        if (c > b1) {
          b2 = b1;
          b1 = c;
        } else if (c > b2) {
          b2 = c;
        }
      }
      gscore[g] = b1 + b2;
      gkeep[g] = false;
    }
    for (int64_t i = 0; i < r.topk_group; ++i) {
      int64_t best = -1;
      for (int64_t g = 0; g < G; ++g) {
        if (!gkeep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      }
      gkeep[best] = true;
    }
    for (int64_t e = 0; e < E; ++e) {
      if (!gkeep[e / per]) choice[e] = 0.0f;
    }
  }
  for (int64_t e = 0; e < E; ++e) taken[e] = false;
  float wsum = 0;
  for (int64_t k = 0; k < K; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
    }
    taken[best] = true;
    ids[k] = static_cast<int32_t>(best);
    wsum += prob[best];
  }
  if (r.sigmoid) wsum += 1e-20f;
  for (int64_t k = 0; k < K; ++k) {
    float w = prob[ids[k]];
    if (r.norm_topk) w /= wsum;
    weights[k] = w * r.routed_scale;
  }
}

}  // namespace wsup::engine::cuda
