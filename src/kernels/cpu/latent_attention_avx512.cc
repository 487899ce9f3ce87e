// The AVX-512 inner loops of LatentAttention (see latent_attention.cc for the algorithm). Only
// AVX-512F is needed.
#include "kernels/cpu/latent_attention.h"

#if defined(__x86_64__)

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/avx512_exp2.h"

#include <algorithm>

namespace moe::kernels::cpu {
namespace {

static_assert(kLatentLanes == 16, "one __m512 per 16 floats");

MOE_AVX512 inline float Sum(__m512 v) {
  // Halve the width by swapping 256-bit halves, then 128-bit lanes, then pairs, then neighbours.
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_cvtss_f32(v);
}

__mmask16 TailMask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1); }

// kHeads x kKeys dot products at once: each key vector loaded serves every head and each query
// vector every key, so the loop issues two FMAs per load at 4 x 4.
template <int kHeads, int kKeys>
MOE_AVX512 void DotTile(const float* q, const float* keys, int64_t dim, float* scores, int64_t stride) {
  __m512 acc[kHeads][kKeys];
  for (auto& row : acc) {
    for (__m512& a : row) a = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < dim; i += 16) {
    __m512 k[kKeys];
    for (int j = 0; j < kKeys; ++j) k[j] = LoadOnce(keys + j * dim + i);
    for (int h = 0; h < kHeads; ++h) {
      const __m512 qv = LoadOnce(q + h * dim + i);
      for (int j = 0; j < kKeys; ++j) acc[h][j] = _mm512_fmadd_ps(qv, k[j], acc[h][j]);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int j = 0; j < kKeys; ++j) scores[h * stride + j] = Sum(acc[h][j]);
  }
}

// Keys in the outer loop: a group of keys stays in L1 while every head's query (16 x 576 floats,
// 36 KiB) passes over it, so the tile comes from L2 once rather than once per group of heads.
template <int kKeys>
MOE_AVX512 void ScoresForKeys(const float* q, int64_t heads, const float* keys, int64_t dim, float* scores,
                              int64_t stride) {
  int64_t h = 0;
  for (; h + 4 <= heads; h += 4) DotTile<4, kKeys>(q + h * dim, keys, dim, scores + h * stride, stride);
  q += h * dim;
  scores += h * stride;
  switch (heads - h) {
    case 3: DotTile<3, kKeys>(q, keys, dim, scores, stride); break;
    case 2: DotTile<2, kKeys>(q, keys, dim, scores, stride); break;
    case 1: DotTile<1, kKeys>(q, keys, dim, scores, stride); break;
  }
}

MOE_AVX512 void Scores(const float* q, int64_t heads, const float* keys, int64_t count, int64_t dim, float* scores,
                       int64_t stride) {
  int64_t j = 0;
  for (; j + 4 <= count; j += 4) ScoresForKeys<4>(q, heads, keys + j * dim, dim, scores + j, stride);
  for (; j < count; ++j) ScoresForKeys<1>(q, heads, keys + j * dim, dim, scores + j, stride);
}

MOE_AVX512 void Widen(const bf16* src, int64_t count, float* dst) {
  // BF16 is the top half of an F32: zero-extend each 16-bit value and shift it up.
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
  for (; i < count; ++i) dst[i] = Bf16ToF32(src[i]);
}

MOE_AVX512 float Max(const float* x, int64_t count) {
  __m512 m = _mm512_set1_ps(x[0]);
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + j));
  if (j < count) m = _mm512_mask_max_ps(m, TailMask(count - j), m, _mm512_maskz_loadu_ps(TailMask(count - j), x + j));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, m);
  float best = lanes[0];
  for (float v : lanes) best = std::max(best, v);
  return best;
}

MOE_AVX512 float Exp2Sum(float* x, int64_t count, float ref) {
  const __m512 r = _mm512_set1_ps(ref);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    const __m512 p = Exp2(_mm512_sub_ps(_mm512_loadu_ps(x + j), r));
    _mm512_storeu_ps(x + j, p);
    sum = _mm512_add_ps(sum, p);
  }
  if (j < count) {
    const __mmask16 mask = TailMask(count - j);
    const __m512 p = Exp2(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + j), r));
    _mm512_mask_storeu_ps(x + j, mask, p);
    sum = _mm512_mask_add_ps(sum, mask, sum, p);
  }
  return Sum(sum);
}

// out[h][0..16 kVecs) += sum_j p[h][j] keys[j][0..16 kVecs) for kHeads heads: the accumulators
// stay in registers over all keys, and each key vector loaded serves every head, so at 4 x 4 the
// loop issues two FMAs per load (the broadcasts of p included).
template <int kHeads, int kVecs>
MOE_AVX512 void AccumulateTile(const float* p, int64_t p_stride, const float* keys, int64_t count, int64_t dim,
                               float* out, int64_t out_stride) {
  __m512 acc[kHeads][kVecs];
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVecs; ++v) acc[h][v] = _mm512_loadu_ps(out + h * out_stride + 16 * v);
  }
  for (int64_t j = 0; j < count; ++j) {
    __m512 k[kVecs];
    for (int v = 0; v < kVecs; ++v) k[v] = LoadOnce(keys + j * dim + 16 * v);
    for (int h = 0; h < kHeads; ++h) {
      const __m512 ph = _mm512_set1_ps(p[h * p_stride + j]);
      for (int v = 0; v < kVecs; ++v) acc[h][v] = _mm512_fmadd_ps(ph, k[v], acc[h][v]);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(out + h * out_stride + 16 * v, acc[h][v]);
  }
}

// Columns in the outer loop: a 64-column slice of the tile (64 keys x 256 bytes) stays in L1
// while every group of heads passes over it, so the tile comes from L2 once.
template <int kVecs>
MOE_AVX512 void AccumulateColumns(const float* p, int64_t p_stride, int64_t heads, const float* keys, int64_t count,
                                  int64_t dim, float* out, int64_t out_stride) {
  int64_t h = 0;
  for (; h + 4 <= heads; h += 4) {
    AccumulateTile<4, kVecs>(p + h * p_stride, p_stride, keys, count, dim, out + h * out_stride, out_stride);
  }
  p += h * p_stride;
  out += h * out_stride;
  switch (heads - h) {
    case 3: AccumulateTile<3, kVecs>(p, p_stride, keys, count, dim, out, out_stride); break;
    case 2: AccumulateTile<2, kVecs>(p, p_stride, keys, count, dim, out, out_stride); break;
    case 1: AccumulateTile<1, kVecs>(p, p_stride, keys, count, dim, out, out_stride); break;
  }
}

MOE_AVX512 void Accumulate(const float* p, int64_t p_stride, int64_t heads, const float* keys, int64_t count,
                           int64_t dim, int64_t width, float* out, int64_t out_stride) {
  int64_t col = 0;
  for (; col + 64 <= width; col += 64) AccumulateColumns<4>(p, p_stride, heads, keys + col, count, dim, out + col, out_stride);
  for (; col < width; col += 16) AccumulateColumns<1>(p, p_stride, heads, keys + col, count, dim, out + col, out_stride);
}

// The exponent add of latent_attention.cc: elements with exponent field e keep their bits plus
// shift << 23 when e + shift > 0, become zero otherwise, and stay as they are when e = 255.
MOE_AVX512 inline __m512i ScalePow2Bits(__m512i bits, __m512i add, __m512i min_exponent) {
  const __m512i exponent = _mm512_and_si512(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(0xff));
  const __mmask16 keep = _mm512_cmpgt_epi32_mask(exponent, min_exponent);
  const __mmask16 special = _mm512_cmpeq_epi32_mask(exponent, _mm512_set1_epi32(0xff));
  return _mm512_mask_mov_epi32(_mm512_maskz_add_epi32(keep, bits, add), special, bits);
}

MOE_AVX512 void ScalePow2(float* x, int64_t count, int32_t shift) {
  const __m512i add = _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(shift) << 23));
  const __m512i min_exponent = _mm512_set1_epi32(-shift);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512i bits = _mm512_loadu_si512(x + i);
    _mm512_storeu_si512(x + i, ScalePow2Bits(bits, add, min_exponent));
  }
  if (i < count) {
    const __mmask16 mask = TailMask(count - i);
    const __m512i bits = _mm512_maskz_loadu_epi32(mask, x + i);
    _mm512_mask_storeu_epi32(x + i, mask, ScalePow2Bits(bits, add, min_exponent));
  }
}

MOE_AVX512 void Scale(float* x, int64_t count, float factor) {
  const __m512 f = _mm512_set1_ps(factor);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), f));
  if (i < count) {
    const __mmask16 mask = TailMask(count - i);
    _mm512_mask_storeu_ps(x + i, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), f));
  }
}

}  // namespace

const LatentOps& Avx512LatentOps() {
  static const LatentOps ops{Widen, Scores, Max, Exp2Sum, Accumulate, ScalePow2, Scale};
  return ops;
}

}  // namespace moe::kernels::cpu

#else  // not x86-64: IsaSupported(kAvx512) is false and this is never called.

namespace moe::kernels::cpu {
const LatentOps& Avx512LatentOps() { return GenericLatentOps(); }
}  // namespace moe::kernels::cpu

#endif
