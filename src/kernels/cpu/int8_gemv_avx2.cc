// Int8Gemv's kernels for CPUs with AVX2 but not AVX-512 (int8_gemv.cc's layout and driver): 8
// columns' groups to a 256-bit vector, a pass of one row holding the block's 64 sums in 8 vectors.
// With AVX-VNNI, VPDPBUSD (VEX-encoded) multiplies and sums a vector's groups, as on AVX-512.
// Without it, each half vector's bytes are widened to 16 bits (the weight's zero-extended, it is
// w + 128; x's sign-extended) and VPMADDWD sums them in pairs into INT32, which one VPHADDD
// pairs again; exact like VPDPBUSD, where VPMADDUBSW's 16-bit sums would saturate.
#include "kernels/cpu/int8_gemv_kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>

namespace moe::kernels::cpu {
namespace {

#define MOE_AVX2 __attribute__((target("avx2,fma")))
#define MOE_INLINE_AVX2 MOE_AVX2 inline __attribute__((always_inline))
#define MOE_AVX_VNNI __attribute__((target("avx2,fma,avxvnni")))

constexpr int kVectors = kGemvBlockCols / 8;  // of a block's sums

// Lanes [0, count) of 8 set, as AVX2's masked loads and stores take them.
MOE_INLINE_AVX2 __m256i LaneMask(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

MOE_AVX2 int32_t RowSum(const int8_t* x, int64_t k) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256i acc = _mm256_setzero_si256();
  int64_t p = 0;
  for (; p + 32 <= k; p += 32) {
    const __m256i pairs = _mm256_maddubs_epi16(ones8, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + p)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones16));
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  int32_t sum = 0;
  for (const int32_t lane : lanes) sum += lane;
  for (; p < k; ++p) sum += x[p];
  return sum;
}

// x's 4 bytes of group g, in every 32-bit lane.
MOE_INLINE_AVX2 __m256i Broadcast(const int8_t* x, int64_t g) {
  int32_t xi;
  std::memcpy(&xi, x + 4 * g, sizeof(xi));
  return _mm256_set1_epi32(xi);
}

// acc[v] += the products of one x row and group g of a block, with AVX-VNNI.
MOE_AVX_VNNI inline __attribute__((always_inline)) void AddGroupVnni(__m256i (&acc)[kVectors], const int8_t* x,
                                                                      const uint8_t* w, const uint8_t* ahead,
                                                                      int64_t g) {
  const uint8_t* group = w + g * kGemvGroupBytes;
#pragma GCC unroll 4
  for (int line = 0; line < 4; ++line) _mm_prefetch(ahead + g * kGemvGroupBytes + 64 * line, _MM_HINT_T1);
  const __m256i b = Broadcast(x, g);
#pragma GCC unroll 8
  for (int v = 0; v < kVectors; ++v) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32 * v));
    // As inline assembly: with the intrinsic GCC 12 copies the accumulators on every step.
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc[v]) : "x"(wv), "x"(b));
  }
}

// The same with AVX2 alone. A vector's sums come out with columns in the order 0 1 4 5 2 3 6 7
// (VPHADDD pairs within 128-bit lanes); Unshuffle puts them back.
MOE_INLINE_AVX2 void AddGroupWidened(__m256i (&acc)[kVectors], const int8_t* x, const uint8_t* w,
                                     const uint8_t* ahead, int64_t g) {
  const uint8_t* group = w + g * kGemvGroupBytes;
#pragma GCC unroll 4
  for (int line = 0; line < 4; ++line) _mm_prefetch(ahead + g * kGemvGroupBytes + 64 * line, _MM_HINT_T1);
  const __m256i xw = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(Broadcast(x, g)));
#pragma GCC unroll 8
  for (int v = 0; v < kVectors; ++v) {
    const auto* half = reinterpret_cast<const __m128i*>(group + 32 * v);
    const __m256i lo = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(half)), xw);
    const __m256i hi = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(half + 1)), xw);
    acc[v] = _mm256_add_epi32(acc[v], _mm256_hadd_epi32(lo, hi));
  }
}

MOE_INLINE_AVX2 __m256i Unshuffle(__m256i sums) {
  return _mm256_permutevar8x32_epi32(sums, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
}

// A vector of a row's sums less the bias into `out`; with w_scales (the vector's), turned into F32
// times x_scale, then times each column's scale.
MOE_INLINE_AVX2 void FinishVector(__m256i sums, int32_t bias, float x_scale, const float* w_scales, __m256i mask,
                                  int* out) {
  sums = _mm256_sub_epi32(sums, _mm256_set1_epi32(bias));
  if (!w_scales) {
    _mm256_maskstore_epi32(out, mask, sums);
    return;
  }
  const __m256 scaled =
      _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(x_scale)), _mm256_maskload_ps(w_scales, mask));
  _mm256_maskstore_ps(reinterpret_cast<float*>(out), mask, scaled);
}

// y[0, 0..cols) (+)= acc, finished with `finish` if kFinish.
template <bool kFinish>
MOE_INLINE_AVX2 void AddToRow(const __m256i (&acc)[kVectors], bool first, int32_t* y, int64_t cols,
                              const GemvFinish* finish) {
#pragma GCC unroll 8
  for (int v = 0; v < kVectors; ++v) {
    const __m256i mask = LaneMask(cols - 8 * v);
    int* out = reinterpret_cast<int*>(y + 8 * v);
    const __m256i sums = _mm256_add_epi32(acc[v], first ? _mm256_setzero_si256() : _mm256_maskload_epi32(out, mask));
    if constexpr (kFinish) {
      FinishVector(sums, finish->bias[0], finish->x_scales ? finish->x_scales[0] : 0.0f,
                   finish->w_scales ? finish->w_scales + 8 * v : nullptr, mask, out);
    } else {
      _mm256_maskstore_epi32(out, mask, sums);
    }
  }
}

template <bool kFinish>
MOE_AVX_VNNI void PassVnniOf(const int8_t* x, const uint8_t* w, const uint8_t* ahead, int64_t groups, int64_t runs,
                             int64_t run_stride, bool first, int32_t* y, int64_t cols, const GemvFinish* finish) {
  // Every loop over the accumulators unrolled, so that they stay in registers.
  __m256i acc[kVectors];
#pragma GCC unroll 8
  for (int v = 0; v < kVectors; ++v) acc[v] = _mm256_setzero_si256();
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < runs; ++r) AddGroupVnni(acc, x, w, ahead, r * run_stride + g);
  }
  AddToRow<kFinish>(acc, first, y, cols, finish);
}

template <bool kFinish>
MOE_AVX2 void PassWidenedOf(const int8_t* x, const uint8_t* w, const uint8_t* ahead, int64_t groups, int64_t runs,
                            int64_t run_stride, bool first, int32_t* y, int64_t cols, const GemvFinish* finish) {
  // Every loop over the accumulators unrolled, so that they stay in registers.
  __m256i acc[kVectors];
#pragma GCC unroll 8
  for (int v = 0; v < kVectors; ++v) acc[v] = _mm256_setzero_si256();
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < runs; ++r) AddGroupWidened(acc, x, w, ahead, r * run_stride + g);
  }
#pragma GCC unroll 8
  for (int v = 0; v < kVectors; ++v) acc[v] = Unshuffle(acc[v]);
  AddToRow<kFinish>(acc, first, y, cols, finish);
}

// A pass's loop, finishing the sums (kFinish) or not.
using PassLoop = void (*)(const int8_t* x, const uint8_t* w, const uint8_t* ahead, int64_t groups, int64_t runs,
                          int64_t run_stride, bool first, int32_t* y, int64_t cols, const GemvFinish* finish);

// Branching once, here, rather than after the loop: GCC 12 copies every accumulator on every step
// when they meet a branch after it.
template <PassLoop kFinishing, PassLoop kPlain>
void Pass(const int8_t* x, int64_t, const uint8_t* w, const uint8_t* ahead, int64_t groups, int64_t runs,
          int64_t run_stride, bool first, int32_t* y, int64_t, int64_t cols, const GemvFinish* finish) {
  (finish ? kFinishing : kPlain)(x, w, ahead, groups, runs, run_stride, first, y, cols, finish);
}

}  // namespace

// One row a pass: the block's 64 sums take 8 of the 16 vector registers.
const GemvKernels& AvxVnniGemvKernels() {
  static constexpr GemvKernels kernels{1, {&Pass<&PassVnniOf<true>, &PassVnniOf<false>>}, &RowSum};
  return kernels;
}

const GemvKernels& Avx2GemvKernels() {
  static constexpr GemvKernels kernels{1, {&Pass<&PassWidenedOf<true>, &PassWidenedOf<false>>}, &RowSum};
  return kernels;
}

}  // namespace moe::kernels::cpu

#endif
