// Row-wise kernels, split over the thread pool by rows.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "base/cpu_features.h"
#include "base/thread_pool.h"
#include "kernels/cpu/avx2.h"
#include "kernels/cpu/avx2_exp2.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/avx512_exp2.h"
#include "kernels/kernels.h"

namespace moe::kernels {
namespace {

void QuantizeRow(const float* x, int64_t cols, int8_t* q, float* scale) {
  float amax = 0;
  for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[c]));
  *scale = amax / 127.0f;
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  for (int64_t c = 0; c < cols; ++c) q[c] = static_cast<int8_t>(std::nearbyint(x[c] * inv));
}

#if defined(__x86_64__)
// The same bits as QuantizeRow: max ignores NaN the same way (the second operand wins), and the
// conversion rounds by MXCSR, to nearest even, as nearbyint does. Without AVX-512, nearbyint is a
// libm call per value: ~10% of prefill and ~4% of 32-way decode on the bench model.
MOE_AVX512 void QuantizeRowAvx512(const float* x, int64_t cols, int8_t* q, float* scale) {
  constexpr int64_t kLanes = 16;
  __m512 vmax = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + kLanes <= cols; c += kLanes) vmax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + c)), vmax);
  float amax = _mm512_reduce_max_ps(vmax);
  for (; c < cols; ++c) amax = std::max(amax, std::fabs(x[c]));
  *scale = amax / 127.0f;
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  const __m512 vinv = _mm512_set1_ps(inv);
  for (c = 0; c + kLanes <= cols; c += kLanes) {
    const __m512i rounded = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + c), vinv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + c), _mm512_cvtsepi32_epi8(rounded));
  }
  for (; c < cols; ++c) q[c] = static_cast<int8_t>(std::nearbyint(x[c] * inv));
}

// The same bits again, 8 values at a time, for CPUs with AVX2 but not AVX-512 (where it was ~15% of
// loading the bench model and ~3% of its prefill).
__attribute__((target("avx2"))) void QuantizeRowAvx2(const float* x, int64_t cols, int8_t* q, float* scale) {
  constexpr int64_t kLanes = 8;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + kLanes <= cols; c += kLanes) vmax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + c), abs_mask), vmax);
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, vmax);
  float amax = 0;
  for (const float lane : lanes) amax = std::max(amax, lane);
  for (; c < cols; ++c) amax = std::max(amax, std::fabs(x[c]));
  *scale = amax / 127.0f;
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  const __m256 vinv = _mm256_set1_ps(inv);
  for (c = 0; c + kLanes <= cols; c += kLanes) {
    const __m256i rounded = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + c), vinv));
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + c), _mm_packs_epi16(words, words));
  }
  for (; c < cols; ++c) q[c] = static_cast<int8_t>(std::nearbyint(x[c] * inv));
}
#endif

void SiluMulRange(const float* gate, const float* up, int64_t begin, int64_t end, float* y) {
  for (int64_t i = begin; i < end; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

#if defined(__x86_64__)
// e^-g as 2^(-g log2(e)) on 16 values at once; libm's expf, a call per value, was ~4% of a
// 2048-token prefill. The tail takes the same vector arithmetic under a mask: where a value falls
// in the range, which depends on the batch, must not change its bits.
MOE_AVX512 void SiluMulRangeAvx512(const float* gate, const float* up, int64_t begin, int64_t end, float* y) {
  constexpr int64_t kLanes = 16;
  const __m512 minus_log2e = _mm512_set1_ps(-std::numbers::log2e_v<float>), one = _mm512_set1_ps(1.0f);
  for (int64_t i = begin; i < end; i += kLanes) {
    const __mmask16 mask = static_cast<__mmask16>(end - i >= kLanes ? 0xffff : (1u << (end - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(mask, gate + i);
    const __m512 denominator = _mm512_add_ps(one, cpu::Exp2(_mm512_mul_ps(g, minus_log2e)));
    const __m512 silu = _mm512_div_ps(g, denominator);
    _mm512_mask_storeu_ps(y + i, mask, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(mask, up + i)));
  }
}

// The same on 8 values at once, for CPUs with AVX2 but not AVX-512.
MOE_AVX2 void SiluMulRangeAvx2(const float* gate, const float* up, int64_t begin, int64_t end, float* y) {
  constexpr int64_t kLanes = 8;
  const __m256 minus_log2e = _mm256_set1_ps(-std::numbers::log2e_v<float>), one = _mm256_set1_ps(1.0f);
  for (int64_t i = begin; i < end; i += kLanes) {
    const __m256i mask = cpu::FirstLanes256(end - i);
    const __m256 g = _mm256_maskload_ps(gate + i, mask);
    const __m256 denominator = _mm256_add_ps(one, cpu::Exp2(_mm256_mul_ps(g, minus_log2e)));
    const __m256 silu = _mm256_div_ps(g, denominator);
    _mm256_maskstore_ps(y + i, mask, _mm256_mul_ps(silu, _mm256_maskload_ps(up + i, mask)));
  }
}
#endif

}  // namespace

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
#if defined(__x86_64__)
  static const auto quantize_row = GetCpuFeatures().avx512f ? QuantizeRowAvx512
                                   : GetCpuFeatures().avx2  ? QuantizeRowAvx2
                                                            : QuantizeRow;
#else
  constexpr auto quantize_row = QuantizeRow;
#endif
  ParallelFor(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) quantize_row(x + r * cols, cols, q + r * cols, scales + r);
  });
}

void SiluMul(const float* gate, const float* up, int64_t n, float* y) {
#if defined(__x86_64__)
  static const auto silu_mul = GetCpuFeatures().avx512f                         ? SiluMulRangeAvx512
                               : GetCpuFeatures().avx2 && GetCpuFeatures().fma ? SiluMulRangeAvx2
                                                                               : SiluMulRange;
#else
  constexpr auto silu_mul = SiluMulRange;
#endif
  constexpr int64_t kChunk = 4096;
  ParallelFor((n + kChunk - 1) / kChunk, [&](int64_t begin, int64_t end) {
    silu_mul(gate, up, begin * kChunk, std::min(n, end * kChunk), y);
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
