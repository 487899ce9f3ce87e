// Int8GemmAmx: INT32 products of I8 activation rows and a weight as PackInt8Gemv lays it out, on
// AMX tiles, for every batch Int8Gemv leaves: oneDNN 2.6's own AMX kernel reaches about a fifth of
// the tile unit's peak on the bench model's expert shapes (bench/RESULTS.md), and reading Int8Gemv's
// weight, the one copy of it serves every batch size.
//
// Layout read (int8_gemv.cc; oneDNN's BA16a64b4a for AMX, but for the sign): blocks of 64 columns,
// each k / 4 groups of 4 bytes of k by the 64 columns, so k / 64 chunks of 16 groups (4 KiB). The
// 16 columns from 16 j of a chunk, 256 bytes apart for each group, are one B operand; 16
// activation rows by 64 bytes of k, k bytes apart, an A operand, read in place. The weight's bytes
// are w + 128 (unsigned), so TDPBSUD's products are too large by 128 times each row's sum of x,
// which Int8RowBiases finds and the store takes off; exact, as in Int8Gemv.
//
// Blocking. A task is 32 rows by 32 columns over the whole of k: 2 x 2 accumulator tiles, each
// step of 64 k loading 2 A and 2 B tiles for 4 products. Threads split the column strips, row
// chunks outermost so that a thread's rows stay in its L2 while the strips pass. Up to 32 rows,
// where the weight's stream from memory is the bound, a task is 16 rows by a block's 64 columns
// (1 A and 4 B tiles a step), so that each 4 KiB chunk is read whole at once: on the bench model's
// lm_head about a quarter less time than the 32 x 32 tasks up to 16 rows, less at 32
// (bench/RESULTS.md). Products are exact in INT32 whatever the order, so the result is oneDNN's
// to the bit; Int8GemmAmxScaled scales a task's products while they are in cache, as
// Int8GemvScaled does.
#include "kernels/cpu/int8_gemv.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/cpu_features.h"
#include "base/int_math.h"
#include "base/thread_pool.h"

#if defined(__x86_64__)
#include "kernels/cpu/amx.h"
#endif

namespace moe::kernels::cpu {

#if defined(__x86_64__)
namespace {

#define MOE_AMX_INT8 __attribute__((target("amx-tile,amx-int8")))
#define MOE_AMX_INT8_AVX512 __attribute__((target("amx-tile,amx-int8,avx512f")))

constexpr int64_t kBlock = 64;                    // oneDNN's block of k and of columns
constexpr int64_t kChunkBytes = kBlock * kBlock;  // one block of columns by one of k
constexpr int64_t kQuadBytes = 4 * kBlock;        // a quad of k for the chunk's 64 columns
constexpr int64_t kTaskRows = 2 * kAmxRows;
constexpr int64_t kTaskCols = 2 * kAmxRows;
constexpr int64_t kChunkRows = 256;  // rows a thread keeps while the column strips pass

// Where a task's products go, less their rows' biases: INT32 to `products`, or with scales
// float(product) * x_scale * w_scale to `scaled`, Matmul's epilogue in its order of operations;
// rows ldy apart.
struct Output {
  const int32_t* biases = nullptr;
  int32_t* products = nullptr;
  float* scaled = nullptr;
  const float* x_scales = nullptr;
  const float* w_scales = nullptr;
  int64_t ldy = 0;
};

// Rows [row, row + rows) of the output from a task's products c (kCols columns per row, from
// column col): INT32 as they are, or scaled.
template <int64_t kCols>
MOE_AMX_INT8_AVX512 void Store(const int32_t (*c)[kCols], int64_t row, int64_t rows, int64_t col, const Output& out) {
  for (int64_t i = 0; i < rows; ++i) {
    const __m512i bias = _mm512_set1_epi32(out.biases[row + i]);
    const __m512 x_scale = out.products ? __m512{} : _mm512_set1_ps(out.x_scales[row + i]);
    for (int64_t v = 0; v < kCols; v += 16) {
      const __m512i products = _mm512_sub_epi32(_mm512_load_si512(&c[i][v]), bias);
      if (out.products) {
        _mm512_storeu_si512(out.products + (row + i) * out.ldy + col + v, products);
        continue;
      }
      _mm512_storeu_ps(out.scaled + (row + i) * out.ldy + col + v,
                       _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(products), x_scale),
                                     _mm512_loadu_ps(out.w_scales + col + v)));
    }
  }
}

// Rows [row, row + rows) of the output (rows <= 32), columns [col, col + 32): x (32 rows k apart,
// zeros past `rows`) times the strip of the weight that holds the columns.
MOE_AMX_INT8_AVX512 void Task(const int8_t* x, int64_t k, const uint8_t* strip, int64_t row, int64_t rows,
                              int64_t col, const Output& out) {
  ZeroAccumulators();
  for (int64_t p = 0; p < k; p += kBlock) {
    const uint8_t* chunk = strip + p / kBlock * kChunkBytes;
    _tile_loadd(4, x + p, k);
    _tile_loadd(5, x + kAmxRows * k + p, k);
    _tile_loadd(6, chunk, kQuadBytes);
    _tile_loadd(7, chunk + 4 * kAmxRows, kQuadBytes);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 4, 7);
    _tile_dpbsud(2, 5, 6);
    _tile_dpbsud(3, 5, 7);
  }
  alignas(64) int32_t c[kTaskRows][kTaskCols];
  constexpr int kRowBytes = kTaskCols * sizeof(int32_t);
  _tile_stored(0, &c[0][0], kRowBytes);
  _tile_stored(1, &c[0][kAmxRows], kRowBytes);
  _tile_stored(2, &c[kAmxRows][0], kRowBytes);
  _tile_stored(3, &c[kAmxRows][kAmxRows], kRowBytes);
  Store(c, row, rows, col, out);
}

// Rows [row, row + rows) of the output (rows <= 16), the 64 columns of one block from col: x (16
// rows k apart, zeros past `rows`) times the block, each chunk read whole (4 KiB in a row) and once.
// For a few rows, where the weight's stream from memory bounds the time: a 32 x 32 task reads
// each chunk's 128-byte halves in turn.
MOE_AMX_INT8_AVX512 void WideTask(const int8_t* x, int64_t k, const uint8_t* block, int64_t row, int64_t rows,
                                  int64_t col, const Output& out) {
  ZeroAccumulators();
  for (int64_t p = 0; p < k; p += kBlock) {
    const uint8_t* chunk = block + p / kBlock * kChunkBytes;
    _tile_loadd(4, x + p, k);
    _tile_loadd(5, chunk, kQuadBytes);
    _tile_dpbsud(0, 4, 5);
    _tile_loadd(6, chunk + 4 * kAmxRows, kQuadBytes);
    _tile_dpbsud(1, 4, 6);
    _tile_loadd(7, chunk + 8 * kAmxRows, kQuadBytes);
    _tile_dpbsud(2, 4, 7);
    _tile_loadd(5, chunk + 12 * kAmxRows, kQuadBytes);
    _tile_dpbsud(3, 4, 5);
  }
  alignas(64) int32_t c[kAmxRows][kBlock];
  constexpr int kRowBytes = kBlock * sizeof(int32_t);
  _tile_stored(0, &c[0][0], kRowBytes);
  _tile_stored(1, &c[0][kAmxRows], kRowBytes);
  _tile_stored(2, &c[0][2 * kAmxRows], kRowBytes);
  _tile_stored(3, &c[0][3 * kAmxRows], kRowBytes);
  Store(c, row, rows, col, out);
}

MOE_AMX_INT8 void Configure() {
  static const TileConfig config;
  _tile_loadconfig(&config);
}

MOE_AMX_INT8 void Release() { _tile_release(); }

// Up to 32 rows (decode batches): WideTask on each block, once or twice, the second time from L2.
// Rows short of a whole tile go through a copy padded with zeros.
void RunFewRows(const int8_t* x, int64_t m, int64_t k, int64_t n, const uint8_t* packed, const Output& out) {
  std::vector<int8_t> padded;
  if (m % kAmxRows != 0) {
    padded.assign(RoundUp(m, kAmxRows) * k, 0);
    std::memcpy(padded.data(), x, m * k);
    x = padded.data();
  }
  ParallelFor(n / kBlock, [&](int64_t begin, int64_t end) {
    Configure();
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t r = 0; r < m; r += kAmxRows) {
        WideTask(x + r * k, k, packed + b * k * kBlock, r, std::min(kAmxRows, m - r), b * kBlock, out);
      }
    }
    Release();
  });
}

void Run(const int8_t* x, int64_t m, int64_t k, int64_t n, const uint8_t* packed, Output out) {
  MOE_CHECK(Int8GemmAmxSupported(k, n), "Int8GemmAmx: no AMX-INT8, or k %lld / n %lld not multiples of 64",
            static_cast<long long>(k), static_cast<long long>(n));
  std::vector<int32_t> biases(m);
  out.biases = biases.data();
  if (m <= kTaskRows) {
    Int8RowBiases(x, m, k, biases.data());
    RunFewRows(x, m, k, n, packed, out);
    return;
  }
  // A prompt's rows are megabytes: their sums take every thread.
  ParallelFor(m, [&](int64_t begin, int64_t end) { Int8RowBiases(x + begin * k, end - begin, k, &biases[begin]); });
  const int64_t strips = n / kTaskCols, chunks = CeilDiv(m, kChunkRows);
  const int64_t whole = m / kTaskRows * kTaskRows;  // rows in whole tasks; the rest go through a copy
  ParallelFor(chunks * strips, [&](int64_t begin, int64_t end) {
    // The last rows padded with zeros to a whole task.
    std::vector<int8_t> tail;
    if (whole < m) {
      tail.assign(kTaskRows * k, 0);
      std::memcpy(tail.data(), x + whole * k, (m - whole) * k);
    }
    Configure();
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first_row = t / strips * kChunkRows, last_row = std::min(m, first_row + kChunkRows);
      const int64_t col = t % strips * kTaskCols;
      const uint8_t* strip = packed + col / kBlock * (k / kBlock) * kChunkBytes + col % kBlock * 4;
      for (int64_t r = first_row; r < last_row; r += kTaskRows) {
        if (r < whole) {
          Task(x + r * k, k, strip, r, kTaskRows, col, out);
        } else {
          Task(tail.data(), k, strip, r, m - r, col, out);
        }
      }
    }
    Release();
  });
}

}  // namespace

bool Int8GemmAmxSupported(int64_t k, int64_t n) {
  return GetCpuFeatures().amx_int8 && k % kBlock == 0 && n % kBlock == 0 && k <= (int64_t{1} << 16);
}

void Int8GemmAmx(const int8_t* x, int64_t m, int64_t k, int64_t n, const uint8_t* packed, int32_t* y) {
  Run(x, m, k, n, packed, {.products = y, .ldy = n});
}

void Int8GemmAmxScaled(const int8_t* x, const float* x_scales, int64_t m, int64_t k, int64_t n, const uint8_t* packed,
                       const float* w_scales, float* y) {
  Run(x, m, k, n, packed, {.scaled = y, .x_scales = x_scales, .w_scales = w_scales, .ldy = n});
}

#else
bool Int8GemmAmxSupported(int64_t, int64_t) { return false; }

void Int8GemmAmx(const int8_t*, int64_t, int64_t, int64_t, const uint8_t*, int32_t*) {
  MOE_CHECK(false, "Int8GemmAmx needs x86-64");
}

void Int8GemmAmxScaled(const int8_t*, const float*, int64_t, int64_t, int64_t, const uint8_t*, const float*, float*) {
  MOE_CHECK(false, "Int8GemmAmx needs x86-64");
}
#endif

}  // namespace moe::kernels::cpu
