// The AVX2 inner loops of LatentAttention (see latent_attention.cc for the algorithm), for CPUs
// without AVX-512: latent_attention_avx512.cc's loops on 8-float vectors. AVX2 has 16 vector
// registers where AVX-512 has 32, so the register tiles are 4 x 3 instead of 4 x 4, and AVX2 has no
// mask registers, so the tails blend with lane masks.
#include "kernels/cpu/latent_attention.h"

#if defined(__x86_64__)

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/avx2_exp2.h"

namespace moe::kernels::cpu {
namespace {

static_assert(kLatentLanes % 8 == 0, "rows are whole __m256s");

// kHeads x kKeys dot products at once: each key vector loaded serves every head and each query
// vector every key. At 4 x 3, the 12 accumulators, 3 keys and a query fill the 16 registers.
template <int kHeads, int kKeys>
MOE_AVX2 void DotTile(const float* q, const float* keys, int64_t dim, float* scores, int64_t stride) {
  __m256 acc[kHeads][kKeys];
  for (auto& row : acc) {
    for (__m256& a : row) a = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < dim; i += 8) {
    __m256 k[kKeys];
    for (int j = 0; j < kKeys; ++j) k[j] = LoadOnce256(keys + j * dim + i);
    for (int h = 0; h < kHeads; ++h) {
      const __m256 qv = LoadOnce256(q + h * dim + i);
      for (int j = 0; j < kKeys; ++j) acc[h][j] = _mm256_fmadd_ps(qv, k[j], acc[h][j]);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int j = 0; j < kKeys; ++j) scores[h * stride + j] = Sum256(acc[h][j]);
  }
}

// Keys in the outer loop, as on AVX-512: a group of keys stays in L1 while every head's query
// passes over it, so the tile comes from L2 once.
template <int kKeys>
MOE_AVX2 void ScoresForKeys(const float* q, int64_t heads, const float* keys, int64_t dim, float* scores,
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

MOE_AVX2 void Scores(const float* q, int64_t heads, const float* keys, int64_t count, int64_t dim, float* scores,
                     int64_t stride) {
  int64_t j = 0;
  for (; j + 3 <= count; j += 3) ScoresForKeys<3>(q, heads, keys + j * dim, dim, scores + j, stride);
  for (; j < count; ++j) ScoresForKeys<1>(q, heads, keys + j * dim, dim, scores + j, stride);
}

MOE_AVX2 void Widen(const bf16* src, int64_t count, float* dst) {
  // BF16 is the top half of an F32: zero-extend each 16-bit value and shift it up.
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  }
  for (; i < count; ++i) dst[i] = Bf16ToF32(src[i]);
}

MOE_AVX2 float Max(const float* x, int64_t count) {
  __m256 m = _mm256_set1_ps(x[0]);
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + j));
  if (j < count) {
    // The lanes past the end take m's own value, which cannot raise it.
    const __m256i mask = FirstLanes256(count - j);
    m = _mm256_max_ps(m, _mm256_blendv_ps(m, _mm256_maskload_ps(x + j, mask), _mm256_castsi256_ps(mask)));
  }
  return Max256(m);
}

MOE_AVX2 float Exp2Sum(float* x, int64_t count, float ref) {
  const __m256 r = _mm256_set1_ps(ref);
  __m256 sum = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const __m256 p = Exp2(_mm256_sub_ps(_mm256_loadu_ps(x + j), r));
    _mm256_storeu_ps(x + j, p);
    sum = _mm256_add_ps(sum, p);
  }
  if (j < count) {
    const __m256i mask = FirstLanes256(count - j);
    const __m256 p = Exp2(_mm256_sub_ps(_mm256_maskload_ps(x + j, mask), r));
    _mm256_maskstore_ps(x + j, mask, p);
    sum = _mm256_add_ps(sum, _mm256_and_ps(p, _mm256_castsi256_ps(mask)));
  }
  return Sum256(sum);
}

// out[h][0..8 kVecs) += sum_j p[h][j] keys[j][0..8 kVecs) for kHeads heads: the accumulators stay
// in registers over all keys, and each key vector loaded serves every head. At 4 x 3, the 12
// accumulators, 3 key vectors and a broadcast of p fill the 16 registers.
template <int kHeads, int kVecs>
MOE_AVX2 void AccumulateTile(const float* p, int64_t p_stride, const float* keys, int64_t count, int64_t dim,
                             float* out, int64_t out_stride) {
  __m256 acc[kHeads][kVecs];
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVecs; ++v) acc[h][v] = _mm256_loadu_ps(out + h * out_stride + 8 * v);
  }
  for (int64_t j = 0; j < count; ++j) {
    __m256 k[kVecs];
    for (int v = 0; v < kVecs; ++v) k[v] = LoadOnce256(keys + j * dim + 8 * v);
    for (int h = 0; h < kHeads; ++h) {
      const __m256 ph = _mm256_broadcast_ss(p + h * p_stride + j);
      for (int v = 0; v < kVecs; ++v) acc[h][v] = _mm256_fmadd_ps(ph, k[v], acc[h][v]);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(out + h * out_stride + 8 * v, acc[h][v]);
  }
}

// Columns in the outer loop: a 24-column slice of the tile stays in L1 while every group of heads
// passes over it, so the tile comes from L2 once.
template <int kVecs>
MOE_AVX2 void AccumulateColumns(const float* p, int64_t p_stride, int64_t heads, const float* keys, int64_t count,
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

MOE_AVX2 void Accumulate(const float* p, int64_t p_stride, int64_t heads, const float* keys, int64_t count,
                         int64_t dim, int64_t width, float* out, int64_t out_stride) {
  int64_t col = 0;
  for (; col + 24 <= width; col += 24) AccumulateColumns<3>(p, p_stride, heads, keys + col, count, dim, out + col, out_stride);
  // width is a multiple of 16, so 0, 8 or 16 columns are left.
  if (col + 16 <= width) {
    AccumulateColumns<2>(p, p_stride, heads, keys + col, count, dim, out + col, out_stride);
  } else if (col < width) {
    AccumulateColumns<1>(p, p_stride, heads, keys + col, count, dim, out + col, out_stride);
  }
}

// The exponent add of latent_attention.cc: elements with exponent field e keep their bits plus
// shift << 23 when e + shift > 0, become zero otherwise, and stay as they are when e = 255.
MOE_AVX2 inline __m256i ScalePow2Bits(__m256i bits, __m256i add, __m256i min_exponent) {
  const __m256i exponent = _mm256_and_si256(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(0xff));
  const __m256i keep = _mm256_cmpgt_epi32(exponent, min_exponent);
  const __m256i special = _mm256_cmpeq_epi32(exponent, _mm256_set1_epi32(0xff));
  return _mm256_blendv_epi8(_mm256_and_si256(keep, _mm256_add_epi32(bits, add)), bits, special);
}

MOE_AVX2 void ScalePow2(float* x, int64_t count, int32_t shift) {
  const __m256i add = _mm256_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(shift) << 23));
  const __m256i min_exponent = _mm256_set1_epi32(-shift);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + i), ScalePow2Bits(bits, add, min_exponent));
  }
  if (i < count) {
    int* tail = reinterpret_cast<int*>(x + i);
    const __m256i mask = FirstLanes256(count - i);
    _mm256_maskstore_epi32(tail, mask, ScalePow2Bits(_mm256_maskload_epi32(tail, mask), add, min_exponent));
  }
}

MOE_AVX2 void Scale(float* x, int64_t count, float factor) {
  const __m256 f = _mm256_set1_ps(factor);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), f));
  if (i < count) {
    const __m256i mask = FirstLanes256(count - i);
    _mm256_maskstore_ps(x + i, mask, _mm256_mul_ps(_mm256_maskload_ps(x + i, mask), f));
  }
}

}  // namespace

const LatentOps& Avx2LatentOps() {
  static const LatentOps ops{Widen, Scores, Max, Exp2Sum, Accumulate, ScalePow2, Scale};
  return ops;
}

}  // namespace moe::kernels::cpu

#else  // not x86-64: IsaSupported(kAvx2) is false and this is never called.

namespace moe::kernels::cpu {
const LatentOps& Avx2LatentOps() { return GenericLatentOps(); }
}  // namespace moe::kernels::cpu

#endif
