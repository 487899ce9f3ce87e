// BatchInvariantMatmul: y = x · w^T for F32 and BF16 weights, where each output's sum over k runs
// in one fixed order, so that a row's result does not depend on the other rows of the batch.
//
// Why: oneDNN picks its GEMM kernel, and with it the order of the sums, by the number of rows M
// (measured with oneDNN 2.6: an F32 row's bits change between M < 16 and M >= 16, a BF16 row's
// between M = 1 and M > 1). Under W8A8 every other GEMM accumulates INT8 products exactly, and
// only the router (F32) remains; through this kernel a request's logits are the same to the bit
// alone or in any batch. The lm_head of F32 and BF16 runs takes it too.
//
// The orders (SumOrder), for every output y[r, j], both ending in the same pairwise sum of 16
// lane sums: l + (l + 8), then + 4, + 2, + 1.
// - kLanes (F32 weights; BF16 weights where the CPU lacks AVX512_BF16): lane l takes the products
//   of k = l, l + 16, l + 32, ... in increasing k by fused multiply-add (past the end of k, 0 * 0).
// - kBf16Pairs (BF16 weights on CPUs with AVX512_BF16): lane l takes, from each 32 values of k,
//   the products of 2l + 1 and then 2l, each added by a fused multiply-add with denormals flushed
//   -- what one VDPBF16PS does (Intel's definition; the tests check the instruction against it),
//   with twice the products per instruction of F32 FMAs, which is what oneDNN's BF16 GEMM uses.
// - kAmxTiles (BF16 weights on CPUs with AMX-BF16): no lanes; from each 32 values of k, the even
//   and the odd products are summed apart, each in increasing k from 0, added together, and that
//   added to the running sum -- what one TDPBF16PS does per output (Intel's definition, flushing
//   denormals as VDPBF16PS does; the tests check the instruction against it). The weight rows are
//   the tiles' A operand, read in place with their row stride, and x^T the B operand, so 16 x 16
//   outputs take one instruction of 16 x 16 x 32 products: the lm_head at 32 rows is bound by
//   reading its weight, not by arithmetic as with VDPBF16PS.
// The AVX-512 loops keep each lane-sum vector in a register over the whole of k, for tiles of up
// to 6 x 4 outputs; the AVX2 loops (kLanes only, on CPUs without AVX-512) keep the 16 lanes as two
// vectors of 8, for tiles of 3 x 2 outputs (1 x 4 for a single row); the generic loops spell each
// order out lane by lane. Threads split the weight rows in tiles of 4, and each output is computed
// whole by one tile, so neither the tiling nor m nor the thread count changes a bit. (Which order runs depends on the CPU, so results may differ
// between machines, never between batches.)
//
// Cost, measured against oneDNN on one core of the bench machine: BF16 lm_head at 1 and 32 rows
// about the same (4096 x 256: 0.05 ms and ~0.4 ms; 32768 x 7168: ~25 ms and ~90 ms), 1.8x slower
// at 256 rows, a size the engine never asks for (it takes logits of sampled rows only); the F32
// router about the same up to 32 rows, 2x slower at 256 (V3's 256 x 7168: 14 ms vs 7 ms). With
// AMX tiles (bench lm_head 129280 x 2048, 2 threads): 21 / 22 / 28 / 38 ms at 1 / 8 / 32 / 64
// rows against 21 / 35 / 107 / 208 ms for VDPBF16PS: at 1 row both read the weight at the
// bandwidth limit; from 8 rows VDPBF16PS is bound by its arithmetic, the tiles still by reading.
#include "kernels/cpu/invariant_matmul.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "base/cpu_features.h"
#include "base/int_math.h"
#include "base/thread_pool.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/avx2.h"
#include "kernels/cpu/avx512.h"

namespace moe::kernels::cpu {
namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kTile = 4;  // weight rows per tile

inline float ToF32(float v) { return v; }
inline float ToF32(bf16 v) { return Bf16ToF32(v); }

// The inputs of one call: x rounded as the weights ask, each row padded with zeros to `stride`
// (a multiple of 16), and the weight.
template <typename W>
struct Operands {
  const float* x;
  int64_t m, stride;
  const W* w;
  int64_t n, k;
};

// The pairwise sum of 16 lanes: l + (l + 8), then + 4, + 2, + 1.
float ReduceLanes(float* lanes) {
  for (int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (int64_t l = 0; l < width; ++l) lanes[l] = lanes[l] + lanes[l + width];
  }
  return lanes[0];
}

template <typename W>
void GenericRows(const Operands<W>& o, int64_t j_begin, int64_t j_end, float* y) {
  for (int64_t j = j_begin; j < j_end; ++j) {
    const W* wj = o.w + j * o.k;
    for (int64_t r = 0; r < o.m; ++r) {
      const float* xr = o.x + r * o.stride;
      float lanes[kLanes] = {};
      for (int64_t base = 0; base < o.stride; base += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) {
          const int64_t i = base + l;
          lanes[l] = std::fma(xr[i], i < o.k ? ToF32(wj[i]) : 0.0f, lanes[l]);
        }
      }
      y[r * o.n + j] = ReduceLanes(lanes);
    }
  }
}

// Denormals to zero, keeping the sign: AVX512_BF16's dot product does so to its inputs and results.
inline float FlushDenormal(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }

// sum + x[i] * w[i] (w zero past k) by a fused multiply-add, inputs and result flushed: one step of
// the BF16 dot-product instructions.
inline float AddBf16Product(float sum, const bf16* x, const bf16* w, int64_t i, int64_t k) {
  const float a = FlushDenormal(Bf16ToF32(x[i]));
  const float b = i < k ? FlushDenormal(Bf16ToF32(w[i])) : 0.0f;
  return FlushDenormal(std::fma(a, b, sum));
}

// Generic loops over x rows in BF16, padded with zeros to `stride` (a multiple of 32), and BF16
// weight rows [j_begin, j_end) of k values: y[r, j] = dot(x row, weight row, stride, k).
template <typename Dot>
void GenericBf16Rows(const bf16* x, int64_t m, int64_t stride, const bf16* w, int64_t n, int64_t k, int64_t j_begin,
                     int64_t j_end, float* y, Dot dot) {
  for (int64_t j = j_begin; j < j_end; ++j) {
    for (int64_t r = 0; r < m; ++r) y[r * n + j] = dot(x + r * stride, w + j * k, stride, k);
  }
}

// The BF16-pairs order (SumOrder::kBf16Pairs): lane l of 16 takes, from each 32 values, the
// products of index 2l + 1 and then 2l, each added by a fused multiply-add rounded and flushed as
// VDPBF16PS does; then the lanes' pairwise sum.
float PairsDot(const bf16* x, const bf16* w, int64_t stride, int64_t k) {
  float lanes[kLanes] = {};
  for (int64_t base = 0; base < stride; base += 2 * kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      for (int64_t i : {base + 2 * l + 1, base + 2 * l}) lanes[l] = AddBf16Product(lanes[l], x, w, i, k);
    }
  }
  return ReduceLanes(lanes);
}

// The AMX-tiles order (SumOrder::kAmxTiles): per 32 values of k, the even and the odd products
// summed apart in increasing k, flushed as TDPBF16PS does, then their sum added to the running sum.
float AmxDot(const bf16* x, const bf16* w, int64_t stride, int64_t k) {
  float sum = 0.0f;
  for (int64_t base = 0; base < stride; base += 2 * kLanes) {
    float halves[2] = {0.0f, 0.0f};
    for (int64_t i = base; i < base + 2 * kLanes; ++i) halves[i % 2] = AddBf16Product(halves[i % 2], x, w, i, k);
    sum = FlushDenormal(sum + FlushDenormal(halves[0] + halves[1]));
  }
  return sum;
}

#if defined(__x86_64__)

MOE_AVX512 inline float ReduceLanes(__m512 a) {
  const __m256 lo = _mm512_castps512_ps256(a);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
  const __m256 t = _mm256_add_ps(lo, hi);                                                 // l + (l + 8)
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));  // + 4
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));                                  // + 2
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));                              // + 1
}

MOE_AVX512 inline __m512 Load(const float* p) { return _mm512_loadu_ps(p); }
MOE_AVX512 inline __m512 Load(const bf16* p) {
  // BF16 is the top half of an F32: zero-extend each 16-bit value and shift it up.
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// Where a tile reads its kCols weight rows: row c at w + c * stride, F32 or BF16, its first
// `full` values (a multiple of 16) there and the rest, if any, zero-padded to 16 in F32 at
// tail + 16 * c (read only where full < the padded k, but always a valid buffer).
template <typename T>
struct WeightRows {
  const T* w;
  int64_t stride;
  int64_t full;
  const float* tail;
};

// acc[r][c] += x[r][i, i + 16) * w[c] for a tile's rows and columns.
template <int kRows, int kCols>
MOE_AVX512 inline __attribute__((always_inline)) void Step(__m512 (&acc)[kRows][kCols], const float* x,
                                                           int64_t stride, const __m512* wv, int64_t i) {
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const __m512 xv = _mm512_loadu_ps(x + r * stride + i);
#pragma GCC unroll 8
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
  }
}

// Outputs [kRows, kCols] from x rows (F32, rows of o.stride floats, zero-padded) and weight rows.
// (Every loop over rows and columns is unrolled: a loop left rolled would keep the accumulators in
// memory, and GCC 12 then stores all of them on every step over k.)
template <int kRows, int kCols, typename W, typename T>
MOE_AVX512 void Tile(const Operands<W>& o, const float* x, const WeightRows<T>& w, float* y) {
  __m512 acc[kRows][kCols];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < w.full; i += kLanes) {
    __m512 wv[kCols];
#pragma GCC unroll 8
    for (int c = 0; c < kCols; ++c) wv[c] = Load(w.w + c * w.stride + i);
    Step<kRows, kCols>(acc, x, o.stride, wv, i);
  }
  if (w.full < o.stride) {
    __m512 wv[kCols];
#pragma GCC unroll 8
    for (int c = 0; c < kCols; ++c) wv[c] = _mm512_loadu_ps(w.tail + c * kLanes);
    Step<kRows, kCols>(acc, x, o.stride, wv, w.full);
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < kCols; ++c) y[r * o.n + c] = ReduceLanes(acc[r][c]);
  }
}

// Every x row against kCols weight rows, in tiles of up to 6 x kCols outputs: 24 accumulators at
// 6 x 4, each weight vector loaded once for 6 rows.
template <int kCols, typename W, typename T>
MOE_AVX512 void TileColumns(const Operands<W>& o, const WeightRows<T>& w, int64_t j, float* y) {
  constexpr int64_t kTileRows = 6;
  int64_t r = 0;
  for (; r + kTileRows <= o.m; r += kTileRows) Tile<kTileRows, kCols>(o, o.x + r * o.stride, w, y + r * o.n + j);
  const float* x = o.x + r * o.stride;
  float* yr = y + r * o.n + j;
  switch (o.m - r) {
    case 5: Tile<5, kCols>(o, x, w, yr); break;
    case 4: Tile<4, kCols>(o, x, w, yr); break;
    case 3: Tile<3, kCols>(o, x, w, yr); break;
    case 2: Tile<2, kCols>(o, x, w, yr); break;
    case 1: Tile<1, kCols>(o, x, w, yr); break;
  }
}

template <typename W, typename T>
MOE_AVX512 void Columns(const Operands<W>& o, int64_t cols, const WeightRows<T>& w, int64_t j, float* y) {
  switch (cols) {
    case 4: TileColumns<4>(o, w, j, y); break;
    case 3: TileColumns<3>(o, w, j, y); break;
    case 2: TileColumns<2>(o, w, j, y); break;
    case 1: TileColumns<1>(o, w, j, y); break;
  }
}

MOE_AVX512 void Widen(const bf16* src, int64_t count, float* dst) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) _mm512_storeu_ps(dst + i, Load(src + i));
  for (; i < count; ++i) dst[i] = Bf16ToF32(src[i]);
}

struct Avx512Lanes {
  static void Widen(const bf16* src, int64_t count, float* dst) { cpu::Widen(src, count, dst); }
  template <typename W, typename T>
  static void Columns(const Operands<W>& o, int64_t cols, const WeightRows<T>& w, int64_t j, float* y) {
    cpu::Columns(o, cols, w, j, y);
  }
};

// The kLanes order on AVX2: lanes 0-7 of the 16 in one vector, 8-15 in another, each lane adding
// the same products in the same order as the AVX-512 loops; ReduceLanes's first step is then the
// sum of the two vectors, the rest Sum256's. Same bits as the generic loops.

MOE_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
MOE_AVX2 inline __m256 Load8(const bf16* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

// acc[h][r][c] += x[r][8h, 8h + 8) * w[c][8h, 8h + 8) for both halves h: 16 values of k.
template <int kRows, int kCols, typename T>
MOE_AVX2 inline __attribute__((always_inline)) void Avx2Step(__m256 (&acc)[2][kRows][kCols], const float* x,
                                                             int64_t stride, const T* const (&w)[kCols]) {
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m256 wv[kCols];
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) wv[c] = Load8(w[c] + 8 * h);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * stride + 8 * h);
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c) acc[h][r][c] = _mm256_fmadd_ps(xv, wv[c], acc[h][r][c]);
    }
  }
}

// Outputs [kRows, kCols] as Tile above: 2 x kRows x kCols accumulators, 12 at 3 x 2 (of 16 registers).
template <int kRows, int kCols, typename W, typename T>
MOE_AVX2 void Avx2Tile(const Operands<W>& o, const float* x, const WeightRows<T>& w, float* y) {
  __m256 acc[2][kRows][kCols];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c) acc[h][r][c] = _mm256_setzero_ps();
    }
  }
  for (int64_t i = 0; i < w.full; i += kLanes) {
    const T* rows[kCols];
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) rows[c] = w.w + c * w.stride + i;
    Avx2Step<kRows, kCols>(acc, x + i, o.stride, rows);
  }
  if (w.full < o.stride) {
    const float* tails[kCols];
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) tails[c] = w.tail + c * kLanes;
    Avx2Step<kRows, kCols>(acc, x + w.full, o.stride, tails);
  }
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) y[r * o.n + c] = Sum256(_mm256_add_ps(acc[0][r][c], acc[1][r][c]));
  }
}

template <int kCols, typename W, typename T>
MOE_AVX2 void Avx2TileColumns(const Operands<W>& o, const WeightRows<T>& w, int64_t j, float* y) {
  constexpr int64_t kTileRows = 3;
  int64_t r = 0;
  for (; r + kTileRows <= o.m; r += kTileRows) Avx2Tile<kTileRows, kCols>(o, o.x + r * o.stride, w, y + r * o.n + j);
  const float* x = o.x + r * o.stride;
  float* yr = y + r * o.n + j;
  switch (o.m - r) {
    case 2: Avx2Tile<2, kCols>(o, x, w, yr); break;
    case 1: Avx2Tile<1, kCols>(o, x, w, yr); break;
  }
}

MOE_AVX2 void Avx2Widen(const bf16* src, int64_t count, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(dst + i, Load8(src + i));
  for (; i < count; ++i) dst[i] = Bf16ToF32(src[i]);
}

struct Avx2Lanes {
  static void Widen(const bf16* src, int64_t count, float* dst) { Avx2Widen(src, count, dst); }
  // Up to kTile columns as pairs and a single.
  template <typename W, typename T>
  static void Columns(const Operands<W>& o, int64_t cols, const WeightRows<T>& w, int64_t j, float* y) {
    if (o.m == 1 && cols == kTile) return Avx2Tile<1, kTile>(o, o.x, w, y + j);
    for (int64_t c = 0; c < cols; c += 2) {
      const WeightRows<T> pair{w.w + c * w.stride, w.stride, w.full, w.tail + c * kLanes};
      if (cols - c >= 2) {
        Avx2TileColumns<2>(o, pair, j + c, y);
      } else {
        Avx2TileColumns<1>(o, pair, j + c, y);
      }
    }
  }
};

// Below this many x rows, BF16 weights are widened in registers as they are loaded; from it on,
// each group of 4 weight rows is widened once into a buffer that all x rows then read (measured
// on the bench machine: faster from about 8 rows, slower below).
constexpr int64_t kWidenOnceRows = 8;

// Weight rows [j_begin, j_end) against every x row, kTile weight rows at a time: they stay in
// cache while every x row passes over them. Loops: Avx512Lanes or Avx2Lanes.
template <typename Loops, typename W>
void LanesRows(const Operands<W>& o, int64_t j_begin, int64_t j_end, float* y) {
  const int64_t full = o.k / kLanes * kLanes;
  const bool widen_once = std::is_same_v<W, bf16> && o.m >= kWidenOnceRows;
  std::vector<float> widened(widen_once ? kTile * o.stride : 0, 0.0f);
  alignas(64) float tail[kTile * kLanes];
  for (int64_t j = j_begin; j < j_end; j += kTile) {
    const int64_t cols = std::min(kTile, j_end - j);
    const W* w = o.w + j * o.k;
    if (widen_once) {
      if constexpr (std::is_same_v<W, bf16>) {
        for (int64_t c = 0; c < cols; ++c) Loops::Widen(w + c * o.k, o.k, widened.data() + c * o.stride);
      }
      Loops::Columns(o, cols, WeightRows<float>{widened.data(), o.stride, o.stride, tail}, j, y);
      continue;
    }
    std::fill(tail, tail + kTile * kLanes, 0.0f);
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t i = full; i < o.k; ++i) tail[c * kLanes + i - full] = ToF32(w[c * o.k + i]);
    }
    Loops::Columns(o, cols, WeightRows<W>{w, o.k, full, tail}, j, y);
  }
}

// The BF16-pairs order with VDPBF16PS: 32 products per instruction, twice what F32 FMAs give.
// Outputs [kRows, kCols] from x rows (BF16, rows of `stride`, zero-padded) and weight rows of
// stride k, whose values past `full` (a multiple of 32) come zero-padded from `tail`, 32 per row.
template <int kRows, int kCols>
MOE_AVX512_BF16 void PairTile(const bf16* x, int64_t stride, const bf16* w, int64_t k, int64_t full,
                              const bf16* tail, float* y, int64_t n) {
  __m512 acc[kRows][kCols];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < stride; i += 2 * kLanes) {
    __m512bh wv[kCols];
#pragma GCC unroll 8
    for (int c = 0; c < kCols; ++c) {
      const bf16* from = i < full ? w + c * k + i : tail + c * 2 * kLanes;
      wv[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(from));
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + r * stride + i));
#pragma GCC unroll 8
      for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < kCols; ++c) y[r * n + c] = ReduceLanes(acc[r][c]);
  }
}

template <int kCols>
MOE_AVX512_BF16 void PairColumns(const bf16* x, int64_t m, int64_t stride, const bf16* w, int64_t k, int64_t full,
                                 const bf16* tail, float* y, int64_t n) {
  constexpr int64_t kTileRows = 6;
  int64_t r = 0;
  for (; r + kTileRows <= m; r += kTileRows) {
    PairTile<kTileRows, kCols>(x + r * stride, stride, w, k, full, tail, y + r * n, n);
  }
  x += r * stride;
  y += r * n;
  switch (m - r) {
    case 5: PairTile<5, kCols>(x, stride, w, k, full, tail, y, n); break;
    case 4: PairTile<4, kCols>(x, stride, w, k, full, tail, y, n); break;
    case 3: PairTile<3, kCols>(x, stride, w, k, full, tail, y, n); break;
    case 2: PairTile<2, kCols>(x, stride, w, k, full, tail, y, n); break;
    case 1: PairTile<1, kCols>(x, stride, w, k, full, tail, y, n); break;
  }
}

// Weight rows [j_begin, j_end) against every x row, kTile weight rows at a time, read straight
// from the weight: no widening, so no buffer.
MOE_AVX512_BF16 void Avx512PairRows(const bf16* x, int64_t m, int64_t stride, const bf16* w, int64_t n, int64_t k,
                                    int64_t j_begin, int64_t j_end, float* y) {
  const int64_t full = k / (2 * kLanes) * (2 * kLanes);
  alignas(64) bf16 tail[kTile * 2 * kLanes];
  for (int64_t j = j_begin; j < j_end; j += kTile) {
    const int64_t cols = std::min(kTile, j_end - j);
    const bf16* wj = w + j * k;
    std::fill(tail, tail + kTile * 2 * kLanes, bf16{});
    for (int64_t c = 0; c < cols; ++c) std::copy(wj + c * k + full, wj + c * k + k, tail + c * 2 * kLanes);
    switch (cols) {
      case 4: PairColumns<4>(x, m, stride, wj, k, full, tail, y + j, n); break;
      case 3: PairColumns<3>(x, m, stride, wj, k, full, tail, y + j, n); break;
      case 2: PairColumns<2>(x, m, stride, wj, k, full, tail, y + j, n); break;
      case 1: PairColumns<1>(x, m, stride, wj, k, full, tail, y + j, n); break;
    }
  }
}

// The AMX loops work on groups of 32 weight rows (two A tiles of 16 rows x 32 BF16 values) and
// blocks of 16 x rows (one B tile per 32 values of k: x^T with its values in pairs, as TDPBF16PS
// takes B). Tiles 0-3 accumulate [weight rows 0-15 | 16-31] x [x block 0 | 1]; 4 and 5 hold the
// weight, 6 and 7 the x blocks.
constexpr int64_t kAmxGroup = 2 * kAmxRows;
static_assert(kAmxK == 2 * kLanes);

// x rows as B tiles: block b of 16 rows, k-step s at xt + (b * steps + s) * kAmxTileValues, row p
// holding, for each x row c of the block, its values 32 s + 2p and 32 s + 2p + 1; zeros past m
// and k.
std::vector<bf16> AmxB(const float* x, int64_t m, int64_t k, int64_t steps) {
  const int64_t blocks = (m + kAmxRows - 1) / kAmxRows;
  std::vector<bf16> xt(blocks * steps * kAmxTileValues, bf16{});
  for (int64_t r = 0; r < m; ++r) {
    bf16* block = xt.data() + r / kAmxRows * steps * kAmxTileValues + r % kAmxRows * 2;
    for (int64_t i = 0; i < k; ++i) {
      block[i / kAmxK * kAmxTileValues + i % kAmxK / 2 * kAmxK + i % 2] = F32ToBf16(x[r * k + i]);
    }
  }
  return xt;
}

// Outputs of one group of 32 weight rows (w, rows `w_stride` values apart, `steps` x 32 values
// each) against kBlocks x blocks (xt, one after the other): out[t] for tile t as above, rows the
// weight rows and columns the x rows.
template <int kBlocks>
MOE_AMX void AmxGroup(const bf16* w, int64_t w_stride, const bf16* xt, int64_t steps, float (*out)[kAmxRows][kAmxRows]) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kBlocks == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t w_bytes = w_stride * static_cast<int64_t>(sizeof(bf16));
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, w + s * kAmxK, w_bytes);
    _tile_loadd(5, w + kAmxRows * w_stride + s * kAmxK, w_bytes);
    _tile_loadd(6, xt + s * kAmxTileValues, kAmxK * sizeof(bf16));
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if constexpr (kBlocks == 2) {
      _tile_loadd(7, xt + (steps + s) * kAmxTileValues, kAmxK * sizeof(bf16));
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr int kStride = kAmxRows * sizeof(float);
  _tile_stored(0, out[0], kStride);
  _tile_stored(1, out[1], kStride);
  if constexpr (kBlocks == 2) {
    _tile_stored(2, out[2], kStride);
    _tile_stored(3, out[3], kStride);
  }
}

// Weight-row groups [g_begin, g_end) against every x row. A group that runs past n, or a weight
// whose k is not a multiple of 32, is first copied zero-padded: a tile reads whole rows of 32.
MOE_AMX void AmxGroups(const std::vector<bf16>& xt, int64_t m, const bf16* w, int64_t n, int64_t k, int64_t steps,
                       int64_t g_begin, int64_t g_end, float* y) {
  const TileConfig config;
  _tile_loadconfig(&config);
  const int64_t blocks = (m + kAmxRows - 1) / kAmxRows, padded_k = steps * kAmxK;
  std::vector<bf16> padded;
  alignas(64) float out[4][kAmxRows][kAmxRows];
  for (int64_t g = g_begin; g < g_end; ++g) {
    const int64_t j0 = g * kAmxGroup, rows = std::min(kAmxGroup, n - j0);
    const bf16* wg = w + j0 * k;
    int64_t w_stride = k;
    if (rows < kAmxGroup || k != padded_k) {
      padded.assign(kAmxGroup * padded_k, bf16{});
      for (int64_t c = 0; c < rows; ++c) std::copy(wg + c * k, wg + (c + 1) * k, padded.data() + c * padded_k);
      wg = padded.data();
      w_stride = padded_k;
    }
    for (int64_t b = 0; b < blocks; b += 2) {
      const int64_t pair = std::min<int64_t>(2, blocks - b);
      const bf16* xb = xt.data() + b * steps * kAmxTileValues;
      if (pair == 2) {
        AmxGroup<2>(wg, w_stride, xb, steps, out);
      } else {
        AmxGroup<1>(wg, w_stride, xb, steps, out);
      }
      for (int64_t t = 0; t < 2 * pair; ++t) {
        const int64_t j_first = j0 + t % 2 * kAmxRows, r_first = (b + t / 2) * kAmxRows;
        for (int64_t r = r_first; r < std::min(m, r_first + kAmxRows); ++r) {
          for (int64_t j = j_first; j < std::min(j0 + rows, j_first + kAmxRows); ++j) {
            y[r * n + j] = out[t][j - j_first][r - r_first];
          }
        }
      }
    }
  }
  _tile_release();
}

#endif

// The kLanes order, on the native loops (AVX-512 where the CPU has it, else AVX2) or the generic.
template <typename W>
void Run(bool native, const Operands<W>& o, float* y) {
  const int64_t tiles = (o.n + kTile - 1) / kTile;
  ParallelFor(tiles, [&](int64_t begin, int64_t end) {
    const int64_t j_begin = begin * kTile, j_end = std::min(o.n, end * kTile);
#if defined(__x86_64__)
    if (native && GetCpuFeatures().avx512f) return LanesRows<Avx512Lanes>(o, j_begin, j_end, y);
    if (native) return LanesRows<Avx2Lanes>(o, j_begin, j_end, y);
#endif
    (void)native;
    GenericRows(o, j_begin, j_end, y);
  });
}

// The activations in BF16, as Matmul rounds them, in rows of `stride` padded with zeros.
std::vector<bf16> Bf16Rows(const float* x, int64_t m, int64_t k, int64_t stride) {
  std::vector<bf16> xb(m * stride, bf16{});
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) xb[r * stride + i] = F32ToBf16(x[r * k + i]);
  }
  return xb;
}

// BF16 weights in the BF16-pairs order.
void RunPairs(bool avx512, const float* x, int64_t m, const bf16* w, int64_t n, int64_t k, float* y) {
  const int64_t stride = RoundUp(k, 2 * kLanes);
  const std::vector<bf16> xb = Bf16Rows(x, m, k, stride);
  const int64_t tiles = (n + kTile - 1) / kTile;
  ParallelFor(tiles, [&](int64_t begin, int64_t end) {
    const int64_t j_begin = begin * kTile, j_end = std::min(n, end * kTile);
#if defined(__x86_64__)
    if (avx512) return Avx512PairRows(xb.data(), m, stride, w, n, k, j_begin, j_end, y);
#endif
    (void)avx512;
    GenericBf16Rows(xb.data(), m, stride, w, n, k, j_begin, j_end, y, PairsDot);
  });
}

// BF16 weights in the AMX-tiles order.
void RunAmx(bool native, const float* x, int64_t m, const bf16* w, int64_t n, int64_t k, float* y) {
  const int64_t steps = (k + kAmxK - 1) / kAmxK;
  if (!native) {
    const int64_t stride = steps * kAmxK;
    const std::vector<bf16> xb = Bf16Rows(x, m, k, stride);
    return ParallelFor(n, [&](int64_t begin, int64_t end) {
      GenericBf16Rows(xb.data(), m, stride, w, n, k, begin, end, y, AmxDot);
    });
  }
#if defined(__x86_64__)
  const std::vector<bf16> xt = AmxB(x, m, k, steps);
  ParallelFor((n + kAmxGroup - 1) / kAmxGroup,
              [&](int64_t begin, int64_t end) { AmxGroups(xt, m, w, n, k, steps, begin, end, y); });
#endif
}

}  // namespace

SumOrder BestSumOrder() {
  if (HasNativeLoops(SumOrder::kAmxTiles)) return SumOrder::kAmxTiles;
  return HasNativeLoops(SumOrder::kBf16Pairs) ? SumOrder::kBf16Pairs : SumOrder::kLanes;
}

bool HasNativeLoops(SumOrder order) {
  const CpuFeatures& cpu = GetCpuFeatures();
  switch (order) {
    case SumOrder::kLanes: return cpu.avx512f || (cpu.avx2 && cpu.fma);
    case SumOrder::kBf16Pairs: return cpu.avx512f && cpu.avx512bf16;
    case SumOrder::kAmxTiles: return cpu.avx512f && cpu.amx_bf16;
  }
  return false;
}

void BatchInvariantMatmul(bool native, SumOrder order, const float* x, int64_t m, const Weight& weight, float* y) {
  const TensorView& w = weight.data;
  MOE_CHECK(!native || HasNativeLoops(order), "BatchInvariantMatmul: this CPU lacks the native loops of that order");
  if (m == 0) return;
  if (w.dtype == DType::kI8) return Matmul(x, m, weight, y);  // INT32 sums are exact in any order
  MOE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16, "BatchInvariantMatmul takes F32, BF16 or I8 weights");
  const int64_t n = w.dim(0), k = w.dim(1), stride = RoundUp(k, kLanes);
  if (w.dtype == DType::kBF16 && order == SumOrder::kBf16Pairs) {
    return RunPairs(native, x, m, static_cast<const bf16*>(w.data), n, k, y);
  }
  if (w.dtype == DType::kBF16 && order == SumOrder::kAmxTiles) {
    return RunAmx(native, x, m, static_cast<const bf16*>(w.data), n, k, y);
  }
  // F32 rows that need no padding (the router's) are read where they are.
  if (w.dtype == DType::kF32 && stride == k) {
    return Run(native, Operands<float>{x, m, stride, static_cast<const float*>(w.data), n, k}, y);
  }
  // The activations, rounded to BF16 for BF16 weights as Matmul does, in rows padded with zeros.
  std::vector<float> xp(m * stride, 0.0f);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      const float v = x[r * k + i];
      xp[r * stride + i] = w.dtype == DType::kBF16 ? Bf16ToF32(F32ToBf16(v)) : v;
    }
  }
  if (w.dtype == DType::kF32) {
    Run(native, Operands<float>{xp.data(), m, stride, static_cast<const float*>(w.data), n, k}, y);
  } else {
    Run(native, Operands<bf16>{xp.data(), m, stride, static_cast<const bf16*>(w.data), n, k}, y);
  }
}

}  // namespace moe::kernels::cpu

namespace moe::kernels {

void BatchInvariantMatmul(const float* x, int64_t m, const Weight& w, float* y) {
  static const cpu::SumOrder order = cpu::BestSumOrder();
  static const bool native = cpu::HasNativeLoops(order);
  cpu::BatchInvariantMatmul(native, order, x, m, w, y);
}

}  // namespace moe::kernels
