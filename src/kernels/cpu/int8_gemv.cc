// Int8Gemv: INT32 products of a few I8 activation rows and the plain row-major I8 weight, for
// decode, which reads every weight once per step and so is bound by memory bandwidth. There
// oneDNN's packed GEMM (AMX brgemm) streams a weight from DRAM at ~9.5 GB/s on one core of the
// bench machine, whatever the rows up to 16; this streams it at ~15.5 GB/s at 1-2 rows.
//
// VPDPBUSD multiplies unsigned bytes by signed ones. The weight is made unsigned by flipping its
// sign bit (w + 128) and x stays signed, so each product is too large by 128 * x[i, p]; 128 times
// the sum of each x row, found once per call, is taken off at the end. That costs one XOR per
// weight vector, where making x unsigned instead would cost a second VPDPBUSD per weight vector
// for the weight row's sum. The biased sums, at most 255 * 128 * k, stay within INT32 for k up to
// 2^16, so the result is exact, whatever the order.
//
// A tile is 4 weight rows against up to 4 x rows: each step loads 64 bytes of every weight row
// and multiplies it into 16-lane accumulators, one per (x row, weight row), reduced at the end;
// more x rows take further passes over the tile, whose weight rows are then in L1. Threads split
// the tiles.
#include "kernels/cpu/int8_gemv.h"

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/cpu_features.h"
#include "base/thread_pool.h"
#include "kernels/cpu/avx512.h"

namespace moe::kernels::cpu {
namespace {

#if defined(__x86_64__)

constexpr int64_t kStep = 64;  // bytes of each row per step
constexpr int kTileRows = 4;   // weight rows per tile
constexpr int kPassRows = 4;   // x rows per pass over a tile

#define MOE_INLINE_VNNI MOE_AVX512_VNNI inline __attribute__((always_inline))

MOE_INLINE_VNNI __m512i Load(const int8_t* p) { return _mm512_loadu_si512(p); }
MOE_INLINE_VNNI __m512i Load(const int8_t* p, __mmask64 mask) { return _mm512_maskz_loadu_epi8(mask, p); }

// The first `count` (< 64) bytes of a step.
inline __mmask64 TailMask(int64_t count) { return (uint64_t{1} << count) - 1; }

MOE_AVX512_VNNI int32_t RowSum(const int8_t* x, int64_t k) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc = _mm512_setzero_si512();
  int64_t p = 0;
  for (; p + kStep <= k; p += kStep) acc = _mm512_dpbusd_epi32(acc, ones, Load(x + p));
  if (p < k) acc = _mm512_dpbusd_epi32(acc, ones, Load(x + p, TailMask(k - p)));
  return _mm512_reduce_add_epi32(acc);
}

template <int kM, int kR>
MOE_INLINE_VNNI void Zero(__m512i (&acc)[kM][kR]) {
#pragma GCC unroll 4
  for (int i = 0; i < kM; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < kR; ++j) acc[i][j] = _mm512_setzero_si512();
  }
}

// acc[i][j] += the products of bytes [p, p + 64) of x row i and w row j, the loads masked or not.
// A masked load reads 0 past k in both, and 0 * (0 + 128) adds nothing.
template <int kM, int kR, typename... Mask>
MOE_INLINE_VNNI void Step(__m512i (&acc)[kM][kR], const int8_t* x, const int8_t* w, int64_t k, int64_t p,
                          Mask... mask) {
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i wu[kR];
#pragma GCC unroll 4
  for (int j = 0; j < kR; ++j) wu[j] = _mm512_xor_si512(Load(w + j * k + p, mask...), sign);
#pragma GCC unroll 4
  for (int i = 0; i < kM; ++i) {
    const __m512i xi = Load(x + i * k + p, mask...);
#pragma GCC unroll 4
    for (int j = 0; j < kR; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wu[j], xi);
  }
}

// y[i, j] for kM rows of x and kR rows of w; y's rows are n apart. Prefetches kR rows at `ahead`
// as it goes.
template <int kM, int kR>
MOE_AVX512_VNNI void Tile(const int8_t* x, const int32_t* x_sums, const int8_t* w, const int8_t* ahead, int64_t n,
                          int64_t k, int32_t* y) {
  // Every loop over the tile's rows is unrolled: GCC 12 keeps the accumulators of a rolled one in
  // memory, and stores them all on every step. The last partial step has accumulators of its own:
  // with the same ones, GCC 12 copies every accumulator on every step of the loop.
  __m512i acc[kM][kR];
  Zero(acc);
  int64_t p = 0;
  for (; p + kStep <= k; p += kStep) {
#pragma GCC unroll 4
    for (int j = 0; j < kR; ++j) _mm_prefetch(ahead + j * k + p, _MM_HINT_T0);
    Step(acc, x, w, k, p);
  }
  if (p < k) {
    __m512i tail[kM][kR];
    Zero(tail);
    Step(tail, x, w, k, p, TailMask(k - p));
#pragma GCC unroll 4
    for (int i = 0; i < kM; ++i) {
#pragma GCC unroll 4
      for (int j = 0; j < kR; ++j) acc[i][j] = _mm512_add_epi32(acc[i][j], tail[i][j]);
    }
  }
  // One reduction per accumulator: GCC 12 would copy every accumulator on every step for a shared
  // one that unpacks or blends them.
#pragma GCC unroll 4
  for (int i = 0; i < kM; ++i) {
    const uint32_t bias = 128u * static_cast<uint32_t>(x_sums[i]);
#pragma GCC unroll 4
    for (int j = 0; j < kR; ++j) {
      y[i * n + j] = static_cast<int32_t>(static_cast<uint32_t>(_mm512_reduce_add_epi32(acc[i][j])) - bias);
    }
  }
}

using TileFn = void (*)(const int8_t*, const int32_t*, const int8_t*, const int8_t*, int64_t, int64_t, int32_t*);

template <int kM, size_t... kR>
constexpr std::array<TileFn, sizeof...(kR)> TilesFor(std::index_sequence<kR...>) {
  return {&Tile<kM, static_cast<int>(kR) + 1>...};
}

// kTiles[kM - 1][kR - 1] is Tile<kM, kR>.
template <size_t... kM>
constexpr std::array<std::array<TileFn, kTileRows>, sizeof...(kM)> AllTiles(std::index_sequence<kM...>) {
  return {TilesFor<static_cast<int>(kM) + 1>(std::make_index_sequence<kTileRows>())...};
}
constexpr auto kTiles = AllTiles(std::make_index_sequence<kPassRows>());

#endif

}  // namespace

bool Int8GemvSupported() {
  const CpuFeatures& f = GetCpuFeatures();
  return f.avx512f && f.avx512bw && f.avx512vnni;
}

#if defined(__x86_64__)
void Int8Gemv(const int8_t* x, int64_t m, const int8_t* w, int64_t n, int64_t k, int32_t* y) {
  MOE_CHECK(Int8GemvSupported(), "Int8Gemv: this CPU lacks AVX-512 VNNI");
  std::vector<int32_t> x_sums(m);
  for (int64_t i = 0; i < m; ++i) x_sums[i] = RowSum(x + i * k, k);
  ParallelFor((n + kTileRows - 1) / kTileRows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t j = t * kTileRows;
      const int64_t rows = std::min<int64_t>(kTileRows, n - j);
      // The next tile, while the first pass streams this one: the hardware prefetchers alone leave
      // the loads waiting on memory (1.4x faster at 4 rows). A last tile prefetches itself.
      const int8_t* next = j + kTileRows + rows <= n ? w + (j + kTileRows) * k : w + j * k;
      for (int64_t i = 0; i < m; i += kPassRows) {
        const int64_t pass = std::min<int64_t>(kPassRows, m - i);
        kTiles[pass - 1][rows - 1](x + i * k, x_sums.data() + i, w + j * k, i == 0 ? next : w + j * k, n, k,
                                   y + i * n + j);
      }
    }
  });
}
#else
void Int8Gemv(const int8_t*, int64_t, const int8_t*, int64_t, int64_t, int32_t*) {
  MOE_CHECK(false, "Int8Gemv needs x86-64");
}
#endif

}  // namespace moe::kernels::cpu
