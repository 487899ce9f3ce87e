// Int8Gemv: INT32 products of a few I8 activation rows and a weight packed for it, for decode,
// which reads every weight once per step and so is bound by memory bandwidth.
//
// VPDPBUSD multiplies unsigned bytes by signed ones. The packed weight is made unsigned by flipping
// its sign bit (w + 128) and x stays signed, so each product is too large by 128 * x[i, p]; 128
// times the sum of each x row (Int8RowBiases), found once per call, is taken off at the end. The biased sums, at
// most 255 * 128 * k, stay within INT32 for k up to 2^16, so the result is exact, whatever the
// order.
//
// Layout. For each block of 64 output columns (weight rows, zero past n) and each group of 4 bytes
// of k (zero past k), 256 bytes: column j's 4 bytes at 4 j. One VPDPBUSD multiplies 16 columns'
// groups by one x row's group broadcast to every lane, and its lanes are 16 outputs: nothing to
// reduce at the end, and a block is one stream through memory.
//
// Blocking. A pass takes up to kPassRows x rows against one block over a chunk of k (32 KiB of
// weight, which stays in L1 for the chunk's later passes), the first pass prefetching ahead;
// partial sums wait in y between chunks. Threads split the blocks.
//
// Two streams. A chunk is two runs of groups, one from each half of the block's k, read in turns,
// so that each thread streams from two places in memory at once: on the AMX Xeon measured, two
// threads of a synthetic loop with 4 VPDPBUSDs a line read 24.4-25.2 GB/s from one place each and
// 27.6-29.4 from two (the halves of 128 KiB to 2 MiB blocks), and the 32-sequence decode step's
// experts took ~5% less time (bench/RESULTS.md). INT32 sums are exact in any order, so the
// products do not change.
#include "kernels/cpu/int8_gemv.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/cpu_features.h"
#include "base/int_math.h"
#include "base/thread_pool.h"
#include "kernels/cpu/avx512.h"

namespace moe::kernels::cpu {
namespace {

constexpr int64_t kBlockCols = 64;                    // 4 vectors of 16 INT32 outputs
constexpr int64_t kGroupBytes = 4 * kBlockCols;       // one group of k for a block
constexpr int64_t kStreams = 2;                       // runs of a chunk, from as many places in k
constexpr int64_t kRunGroups = 128 / kStreams;        // a chunk's run: 32 KiB of a block in all
constexpr int kPassRows = 6;                          // 24 accumulators, 4 weight vectors, 1 broadcast
constexpr int64_t kPrefetchAhead = 8 * kGroupBytes;   // 2 KiB: measured best of 0, 2, 8, 32 KiB

#if defined(__x86_64__)

#define MOE_INLINE_VNNI MOE_AVX512_VNNI inline __attribute__((always_inline))

// acc += a * b by bytes, in place: with the intrinsic, GCC 12 copies (and spills) every accumulator
// of an array on every step.
MOE_INLINE_VNNI void DotBytes(__m512i& acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

MOE_AVX512_VNNI int32_t RowSum(const int8_t* x, int64_t k) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc = _mm512_setzero_si512();
  int64_t p = 0;
  for (; p + 64 <= k; p += 64) acc = _mm512_dpbusd_epi32(acc, ones, _mm512_loadu_si512(x + p));
  if (p < k) acc = _mm512_dpbusd_epi32(acc, ones, _mm512_maskz_loadu_epi8((uint64_t{1} << (k - p)) - 1, x + p));
  return _mm512_reduce_add_epi32(acc);
}

// acc[i] += the products of kM x rows (`stride` apart) and group g of a block.
template <int kM>
MOE_INLINE_VNNI void AddGroup(__m512i (&acc)[kM][4], const int8_t* x, int64_t stride, const uint8_t* w,
                              const uint8_t* ahead, int64_t g) {
  const uint8_t* group = w + g * kGroupBytes;
  __m512i wv[4];
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    _mm_prefetch(ahead + g * kGroupBytes + 64 * v, _MM_HINT_T1);
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

// y[i, 0..64) (+)= the products of kM x rows (`stride` apart) and `runs` runs of `groups` groups of
// one block, `run_stride` groups apart, read in turns; stored where `masks` says columns exist.
// `first` starts the sums, otherwise they add to y's.
template <int kM>
MOE_AVX512_VNNI void Pass(const int8_t* x, int64_t stride, const uint8_t* w, const uint8_t* ahead, int64_t groups,
                          int64_t runs, int64_t run_stride, bool first, int32_t* y, int64_t n,
                          const __mmask16 (&masks)[4]) {
  __m512i acc[kM][4];
#pragma GCC unroll 8
  for (int i = 0; i < kM; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[i][v] = _mm512_setzero_si512();
  }
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < runs; ++r) AddGroup<kM>(acc, x, stride, w, ahead, r * run_stride + g);
  }
  // A load masked to nothing on the first chunk rather than a branch: GCC 12 copies every
  // accumulator on every step when they meet a branch after the loop.
#pragma GCC unroll 8
  for (int i = 0; i < kM; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      int32_t* out = y + i * n + 16 * v;
      const __m512i before = _mm512_maskz_loadu_epi32(first ? 0 : masks[v], out);
      _mm512_mask_storeu_epi32(out, masks[v], _mm512_add_epi32(acc[i][v], before));
    }
  }
}

using PassFn = void (*)(const int8_t*, int64_t, const uint8_t*, const uint8_t*, int64_t, int64_t, int64_t, bool,
                        int32_t*, int64_t, const __mmask16 (&)[4]);
constexpr PassFn kPasses[kPassRows] = {&Pass<1>, &Pass<2>, &Pass<3>, &Pass<4>, &Pass<5>, &Pass<6>};

// A row's 64 sums of a block, where `masks` says columns exist, less the bias; with w_scales (the
// block's), turned into F32 times x_scale, then times each column's scale, in place.
MOE_AVX512_VNNI void FinishBlock(int32_t* row, int32_t bias, float x_scale, const float* w_scales,
                                 const __mmask16 (&masks)[4]) {
  for (int v = 0; v < 4; ++v) {
    const __m512i sums = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(masks[v], row + 16 * v), _mm512_set1_epi32(bias));
    if (!w_scales) {
      _mm512_mask_storeu_epi32(row + 16 * v, masks[v], sums);
      continue;
    }
    const __m512 scaled = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(x_scale)),
                                        _mm512_maskz_loadu_ps(masks[v], w_scales + 16 * v));
    _mm512_mask_storeu_ps(row + 16 * v, masks[v], scaled);
  }
}

#endif

}  // namespace

bool Int8GemvSupported() {
  const CpuFeatures& f = GetCpuFeatures();
  return f.avx512f && f.avx512bw && f.avx512vnni;
}

int64_t Int8GemvPackedBytes(int64_t n, int64_t k) { return RoundUp(n, kBlockCols) * RoundUp(k, 4); }

void PackInt8Gemv(const int8_t* w, int64_t n, int64_t k, uint8_t* packed) {
  const int64_t groups = CeilDiv(k, 4);
  ParallelFor(CeilDiv(n, kBlockCols), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t g = 0; g < groups; ++g) {
        uint8_t* group = packed + (b * groups + g) * kGroupBytes;
        for (int64_t j = 0; j < kBlockCols; ++j) {
          for (int64_t q = 0; q < 4; ++q) {
            const int64_t col = b * kBlockCols + j, p = 4 * g + q;
            const int8_t value = col < n && p < k ? w[col * k + p] : 0;
            group[4 * j + q] = static_cast<uint8_t>(value) ^ 0x80;
          }
        }
      }
    }
  });
}

#if defined(__x86_64__)
namespace {

// Int8Gemv, and with x_scales (and w_scales) Int8GemvScaled, whose F32 results go over y's storage
// block by block while the block is in cache.
void Products(const int8_t* x, int64_t m, const uint8_t* packed, int64_t n, int64_t k, const float* x_scales,
              const float* w_scales, int32_t* y) {
  MOE_CHECK(Int8GemvSupported(), "Int8Gemv: this CPU lacks AVX-512 VNNI");
  std::vector<int32_t> bias(m);
  Int8RowBiases(x, m, k, bias.data());
  // Rows whose k is not a whole number of groups are read from a copy padded with zeros.
  const int64_t stride = RoundUp(k, 4);
  std::vector<int8_t> padded;
  if (stride != k) {
    padded.assign(m * stride, 0);
    for (int64_t i = 0; i < m; ++i) std::memcpy(&padded[i * stride], x + i * k, k);
    x = padded.data();
  }
  const int64_t groups = stride / 4;
  // Passes of equal rows: 8 rows as 4 + 4 rather than 6 + 2.
  const int64_t pass_rows = CeilDiv(m, CeilDiv(m, int64_t{kPassRows}));
  ParallelFor(CeilDiv(n, kBlockCols), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t col = b * kBlockCols;
      __mmask16 masks[4];
      for (int v = 0; v < 4; ++v) {
        const int64_t lanes = std::clamp<int64_t>(n - col - 16 * v, 0, 16);
        masks[v] = static_cast<__mmask16>((uint32_t{1} << lanes) - 1);
      }
      const uint8_t* block = packed + b * groups * kGroupBytes;
      // kStreams runs, [g, g + run) of each kStreams-th of k, then the groups left over as one.
      const int64_t part = groups / kStreams;
      auto passes = [&](int64_t g, int64_t run, int64_t runs) {
        const uint8_t* w = block + g * kGroupBytes;
        for (int64_t i = 0; i < m; i += pass_rows) {
          const int64_t rows = std::min(pass_rows, m - i);
          // Prefetching past the end of `packed` is harmless: a prefetch never faults.
          kPasses[rows - 1](x + i * stride + 4 * g, stride, w, i == 0 ? w + kPrefetchAhead : w, run, runs, part,
                            g == 0, y + i * n + col, n, masks);
        }
      };
      for (int64_t g = 0; g < part; g += kRunGroups) passes(g, std::min(kRunGroups, part - g), kStreams);
      if (kStreams * part < groups) passes(kStreams * part, groups - kStreams * part, 1);
      for (int64_t i = 0; i < m; ++i) {
        FinishBlock(y + i * n + col, bias[i], x_scales ? x_scales[i] : 0.0f, x_scales ? w_scales + col : nullptr,
                    masks);
      }
    }
  });
}

}  // namespace

void Int8RowBiases(const int8_t* x, int64_t m, int64_t k, int32_t* biases) {
  MOE_CHECK(Int8GemvSupported(), "Int8RowBiases: this CPU lacks AVX-512 VNNI");
  for (int64_t i = 0; i < m; ++i) biases[i] = 128 * RowSum(x + i * k, k);
}

void Int8Gemv(const int8_t* x, int64_t m, const uint8_t* packed, int64_t n, int64_t k, int32_t* y) {
  Products(x, m, packed, n, k, nullptr, nullptr, y);
}

void Int8GemvScaled(const int8_t* x, const float* x_scales, int64_t m, const uint8_t* packed, int64_t n, int64_t k,
                    const float* w_scales, float* y) {
  static_assert(sizeof(int32_t) == sizeof(float));
  Products(x, m, packed, n, k, x_scales, w_scales, reinterpret_cast<int32_t*>(y));
}
#else
void Int8RowBiases(const int8_t*, int64_t, int64_t, int32_t*) { MOE_CHECK(false, "Int8RowBiases needs x86-64"); }

void Int8Gemv(const int8_t*, int64_t, const uint8_t*, int64_t, int64_t, int32_t*) {
  MOE_CHECK(false, "Int8Gemv needs x86-64");
}

void Int8GemvScaled(const int8_t*, const float*, int64_t, const uint8_t*, int64_t, int64_t, const float*, float*) {
  MOE_CHECK(false, "Int8Gemv needs x86-64");
}
#endif

}  // namespace moe::kernels::cpu
