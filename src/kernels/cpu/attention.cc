// Expanded-form attention over a contiguous cache, one (token, head) pair per task: scores,
// softmax, then the probability-weighted sum of values. (The absorbed form is in
// latent_attention.cc.)
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/kernels.h"

namespace moe::kernels {
namespace {

float Dot(const float* a, const float* b, int64_t n) {
  float acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Turns scores into probabilities in place.
void Softmax(float* scores, int64_t n) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = std::max(max, scores[i]);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (scores[i] = std::exp(scores[i] - max));
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) scores[i] *= inv;
}

// out[0..dim) = sum_s probs[s] * rows[s * row_stride + 0..dim)
void WeightedSum(const float* probs, int64_t count, const float* rows, int64_t row_stride,
                 int64_t dim, float* out) {
  std::fill(out, out + dim, 0.0f);
  for (int64_t s = 0; s < count; ++s) {
    const float* row = rows + s * row_stride;
    for (int64_t i = 0; i < dim; ++i) out[i] += probs[s] * row[i];
  }
}

}  // namespace

void Attention(const float* q, const float* k, const float* v, const AttentionParams& p, float* out) {
  ParallelFor(p.tokens * p.heads, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(p.keys);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / p.heads, h = task % p.heads;
      const int64_t visible = p.q_offset + t + 1;
      const float* qv = q + task * p.qk_dim;
      for (int64_t s = 0; s < visible; ++s) {
        scores[s] = Dot(qv, k + (s * p.heads + h) * p.qk_dim, p.qk_dim) * p.scale;
      }
      Softmax(scores.data(), visible);
      WeightedSum(scores.data(), visible, v + h * p.v_dim, p.heads * p.v_dim, p.v_dim,
                  out + task * p.v_dim);
    }
  });
}

}  // namespace moe::kernels
