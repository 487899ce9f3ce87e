// Int8Gemv's AVX-512 VNNI kernels: one VPDPBUSD multiplies 16 columns' groups by one x row's group
// broadcast to every lane, its lanes 16 outputs; a pass holds 4 vectors of sums for each of up to
// 6 rows.
#include "kernels/cpu/int8_gemv_kernels.h"

#if defined(__x86_64__)

#include <algorithm>
#include <cstring>

#include "kernels/cpu/avx512.h"

namespace moe::kernels::cpu {
namespace {

#define MOE_INLINE_VNNI MOE_AVX512_VNNI inline __attribute__((always_inline))

// acc += a * b by bytes, in place: with the intrinsic, GCC 12 copies (and spills) every accumulator
// of an array on every step.
MOE_INLINE_VNNI void DotBytes(__m512i& acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

// Which of a block's 16-column vectors' lanes hold columns, of the first `cols`.
MOE_INLINE_VNNI void ColumnMasks(int64_t cols, __mmask16 (&masks)[4]) {
  for (int v = 0; v < 4; ++v) {
    const int64_t lanes = std::clamp<int64_t>(cols - 16 * v, 0, 16);
    masks[v] = static_cast<__mmask16>((uint32_t{1} << lanes) - 1);
  }
}

MOE_AVX512_VNNI int32_t RowSum(const int8_t* x, int64_t k) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc = _mm512_setzero_si512();
  int64_t p = 0;
  for (; p + 64 <= k; p += 64) acc = _mm512_dpbusd_epi32(acc, ones, _mm512_loadu_si512(x + p));
  if (p < k) acc = _mm512_dpbusd_epi32(acc, ones, _mm512_maskz_loadu_epi8((uint64_t{1} << (k - p)) - 1, x + p));
  return _mm512_reduce_add_epi32(acc);
}

// acc[i] += the products of kM x rows (`stride` apart) and group g of a block, prefetching the
// same group of `ahead` if kPrefetch.
template <int kM, bool kPrefetch>
MOE_INLINE_VNNI void AddGroup(__m512i (&acc)[kM][4], const int8_t* x, int64_t stride, const uint8_t* w,
                              const uint8_t* ahead, int64_t g) {
  const uint8_t* group = w + g * kGemvGroupBytes;
  __m512i wv[4];
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    if constexpr (kPrefetch) _mm_prefetch(ahead + g * kGemvGroupBytes + 64 * v, _MM_HINT_T1);
    wv[v] = _mm512_loadu_si512(group + 64 * v);
  }
#pragma GCC unroll 8
  for (int i = 0; i < kM; ++i) {
    int32_t xi;
    std::memcpy(&xi, x + i * stride + 4 * g, sizeof(xi));
    const __m512i b = _mm512_set1_epi32(xi);
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) DotBytes(acc[i][v], wv[v], b);
  }
}

// A vector of a row's sums less the bias into `out`; with w_scales (the vector's), turned into F32
// times x_scale, then times each column's scale.
MOE_INLINE_VNNI void FinishVector(__m512i sums, int32_t bias, float x_scale, const float* w_scales, __mmask16 mask,
                                  int32_t* out) {
  sums = _mm512_sub_epi32(sums, _mm512_set1_epi32(bias));
  if (!w_scales) {
    _mm512_mask_storeu_epi32(out, mask, sums);
    return;
  }
  const __m512 scaled = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(x_scale)),
                                      _mm512_maskz_loadu_ps(mask, w_scales));
  _mm512_mask_storeu_ps(out, mask, scaled);
}

template <int kM, bool kFinish>
MOE_AVX512_VNNI void PassOf(const int8_t* x, int64_t stride, const uint8_t* w, const uint8_t* ahead, int64_t groups,
                            int64_t runs, int64_t run_stride, bool first, int32_t* y, int64_t n, int64_t cols,
                            const GemvFinish* finish) {
  __m512i acc[kM][4];
#pragma GCC unroll 8
  for (int i = 0; i < kM; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[i][v] = _mm512_setzero_si512();
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < runs; ++r) AddGroup<kM, true>(acc, x, stride, w, ahead, r * run_stride + g);
  }
  __mmask16 masks[4];
  ColumnMasks(cols, masks);
  // A load masked to nothing on the first chunk rather than a branch: GCC 12 copies every
  // accumulator on every step when they meet a branch after the loop.
#pragma GCC unroll 8
  for (int i = 0; i < kM; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      int32_t* out = y + i * n + 16 * v;
      const __m512i sums = _mm512_add_epi32(acc[i][v], _mm512_maskz_loadu_epi32(first ? 0 : masks[v], out));
      if constexpr (kFinish) {
        FinishVector(sums, finish->bias[i], finish->x_scales ? finish->x_scales[i] : 0.0f,
                     finish->w_scales ? finish->w_scales + 16 * v : nullptr, masks[v], out);
      } else {
        _mm512_mask_storeu_epi32(out, masks[v], sums);
      }
    }
  }
}

// Branching once, here, rather than after the loop (as above).
template <int kM>
MOE_AVX512_VNNI void Pass(const int8_t* x, int64_t stride, const uint8_t* w, const uint8_t* ahead, int64_t groups,
                          int64_t runs, int64_t run_stride, bool first, int32_t* y, int64_t n, int64_t cols,
                          const GemvFinish* finish) {
  if (finish) {
    PassOf<kM, true>(x, stride, w, ahead, groups, runs, run_stride, first, y, n, cols, finish);
  } else {
    PassOf<kM, false>(x, stride, w, ahead, groups, runs, run_stride, first, y, n, cols, nullptr);
  }
}

// kBlocks blocks' sums side by side in registers, so each block is read once, in order, with no
// prefetch: AMD's prefetchers follow every stream.
template <int kBlocks, int kM>
MOE_AVX512_VNNI void SidePass(const int8_t* x, int64_t stride, const uint8_t* const* w, int64_t groups,
                              int32_t* const* y, const int64_t* cols, int64_t n, const int32_t* bias,
                              const float* x_scales, const float* const* w_scales, const uint8_t* prefetch,
                              int64_t prefetch_lines) {
  static_assert(kBlocks * kM * 4 + 4 + 1 <= 32, "every block's sums, a group's weights and an x group fit the registers");
  __m512i acc[kBlocks][kM][4];
#pragma GCC unroll 4
  for (int b = 0; b < kBlocks; ++b) {
#pragma GCC unroll 8
    for (int i = 0; i < kM; ++i) {
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[b][i][v] = _mm512_setzero_si512();
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    if constexpr (kBlocks == 1) {
      if (prefetch) {
        const uint8_t* lines = prefetch + g * prefetch_lines * kGemvLineBytes;
        for (int64_t l = 0; l < prefetch_lines; ++l) _mm_prefetch(lines + l * kGemvLineBytes, _MM_HINT_T0);
      }
    }
#pragma GCC unroll 4
    for (int b = 0; b < kBlocks; ++b) AddGroup<kM, false>(acc[b], x, stride, w[b], nullptr, g);
  }
#pragma GCC unroll 4
  for (int b = 0; b < kBlocks; ++b) {
    __mmask16 masks[4];
    ColumnMasks(cols[b], masks);
#pragma GCC unroll 8
    for (int i = 0; i < kM; ++i) {
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        FinishVector(acc[b][i][v], bias[i], x_scales ? x_scales[i] : 0.0f, w_scales ? w_scales[b] + 16 * v : nullptr,
                     masks[v], y[b] + i * n + 16 * v);
      }
    }
  }
}

}  // namespace

const GemvKernels& Avx512VnniGemvKernels() {
  static_assert(kGemvMaxPassRows == 6 && kGemvMaxSideRows == 3);
  static constexpr GemvKernels kernels{6,
                                       {&Pass<1>, &Pass<2>, &Pass<3>, &Pass<4>, &Pass<5>, &Pass<6>},
                                       &RowSum,
                                       3,
                                       {4, 2, 2},
                                       {&SidePass<4, 1>, &SidePass<2, 2>, &SidePass<2, 3>},
                                       {&SidePass<1, 1>, &SidePass<1, 2>, &SidePass<1, 3>, &SidePass<1, 4>,
                                        &SidePass<1, 5>, &SidePass<1, 6>},
                                       {&SidePass<1, 1>, &SidePass<2, 1>, &SidePass<3, 1>, &SidePass<4, 1>}};
  return kernels;
}

}  // namespace moe::kernels::cpu

#endif
