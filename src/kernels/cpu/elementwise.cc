// Row-wise kernels, split over the thread pool by rows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/kernels.h"

namespace moe::kernels {

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) {
  ParallelFor(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      float sum_sq = 0;
      for (int64_t i = 0; i < dim; ++i) sum_sq += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(sum_sq / dim + eps);
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
    }
  });
}

void QuantizeRows(const float* x, int64_t rows, int64_t cols, int8_t* q, float* scales) {
  ParallelFor(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * cols;
      float amax = 0;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(xr[c]));
      scales[r] = amax / 127.0f;
      const float inv = amax > 0 ? 127.0f / amax : 0.0f;
      for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = static_cast<int8_t>(std::nearbyint(xr[c] * inv));
    }
  });
}

void SiluMul(const float* gate, const float* up, int64_t n, float* y) {
  constexpr int64_t kChunk = 4096;
  ParallelFor((n + kChunk - 1) / kChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * kChunk; i < std::min(n, end * kChunk); ++i) {
      y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    }
  });
}

void ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride, int64_t head_stride,
               const int32_t* positions, const RopeParams& rope) {
  const int64_t pairs = rope.dim / 2;
  ParallelFor(tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> cos(pairs), sin(pairs);
    for (int64_t t = begin; t < end; ++t) {
      // Angles in double: position * inv_freq loses precision in float at long contexts.
      for (int64_t i = 0; i < pairs; ++i) {
        const double angle = positions[t] * rope.inv_freq[i];
        cos[i] = static_cast<float>(std::cos(angle) * rope.scale);
        sin[i] = static_cast<float>(std::sin(angle) * rope.scale);
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + t * token_stride + h * head_stride;
        for (int64_t i = 0; i < pairs; ++i) {
          const float a = v[2 * i], b = v[2 * i + 1];
          v[2 * i] = a * cos[i] - b * sin[i];
          v[2 * i + 1] = a * sin[i] + b * cos[i];
        }
      }
    }
  });
}

}  // namespace moe::kernels
