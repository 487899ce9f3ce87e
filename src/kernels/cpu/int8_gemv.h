// Internals of Matmul's I8 path, open to the tests and benchmarks: a hand-written kernel for a few
// activation rows, and the oneDNN one it stands in for.
#pragma once

#include <cstdint>

namespace moe::kernels::cpu {

// The most activation rows for which Matmul runs Int8Gemv rather than oneDNN's packed GEMM. On the
// bench model's expert and attention shapes, weights streamed from DRAM, 2 threads of an AMD EPYC
// with AVX-512 VNNI, Int8Gemv reading block halves was 1.0-1.3x faster than oneDNN at 1-12 rows,
// even at 16 and 0.83-0.95x at 32-64.
inline constexpr int64_t kInt8GemvMaxRows = 16;
// The same where Int8Gemv reads blocks side by side (GemvStreams::kSideBySide, AMD), and past three
// rows one whole block at a time: the 32-way decode step took 2-4% less time with its 32-row GEMMs
// (the attention projections, the dense and shared MLPs, the lm_head's first parts) on Int8Gemv
// than on oneDNN (bench/RESULTS.md).
inline constexpr int64_t kInt8GemvMaxRowsSideBySide = 32;
// The same where the weight runs on AMX-INT8 tiles (Int8GemmAmxSupported): on an AMX Xeon, 2 threads, Int8GemmAmx's 16-row tasks about match Int8Gemv at 4 rows and run
// 1.1x faster at 8, 1.4x at 16 (bench/RESULTS.md).
inline constexpr int64_t kInt8GemvMaxRowsBesideAmx = 8;
// On AVX2 without AVX-512 Int8Gemv takes every batch. With AVX-VNNI, where oneDNN 2.6's INT8 GEMM
// repacks the weight on every call: on the AMX Xeon capped to AVX2 (MOE_MAX_ISA=avx2), 2 threads,
// 2048 x 2048, Int8Gemv ran 400-515 GOP/s at 16-512 rows against oneDNN's 25-307. Without it,
// oneDNN's INT8 kernels sum pairs of byte products in saturating 16 bits (VPMADDUBSW) and so are
// not exact for full-range weights; Int8Gemv widened to 16 bits is, at 121-137 GOP/s
// (bench/RESULTS.md).

// How many rows Matmul gives Int8Gemv at most for a weight of n x k: one of the above for the
// CPU's best Int8Gemv, or every batch (INT64_MAX) on AVX2. Needs Int8GemvSupported().
int64_t Int8GemvMaxRowsFor(int64_t n, int64_t k);

// The instruction sets Int8Gemv comes in, the same products to the bit on each: AVX2 alone
// (bytes widened to 16 bits), AVX2 with AVX-VNNI (VPDPBUSD on 256 bits), AVX-512 VNNI.
enum class GemvIsa { kAvx2, kAvxVnni, kAvx512Vnni };

bool GemvIsaSupported(GemvIsa isa);

// Whether the CPU runs Int8Gemv at all: AVX2, or AVX-512F, AVX-512BW and AVX512_VNNI.
bool Int8GemvSupported();

// The fastest Int8Gemv the CPU runs, the one the calls without an ISA take. Needs
// Int8GemvSupported().
GemvIsa BestGemvIsa();

// How each thread reads its share of the weight's blocks (int8_gemv.cc): each block's two halves
// of k side by side, or (where the kernels can) several blocks side by side, each whole, for a few
// rows, and one whole block at a time for more. The products are the same to the bit either way.
enum class GemvStreams { kBlockHalves, kSideBySide };

// The faster of the two on this CPU, the one the calls without a choice take: blocks side by side
// on AMD, where they were measured faster, block halves elsewhere.
GemvStreams BestGemvStreams();

// The bytes of an [n, k] I8 weight as PackInt8Gemv lays it out: n rounded up to 64, k to 4.
int64_t Int8GemvPackedBytes(int64_t n, int64_t k);

// Lays out w [n, k] row-major for Int8Gemv (see int8_gemv.cc) into `packed`, of
// Int8GemvPackedBytes(n, k) bytes.
void PackInt8Gemv(const int8_t* w, int64_t n, int64_t k, uint8_t* packed);

// y[i, j] = sum over p of x[i, p] * w[j, p], in INT32, for x [m, k] row-major and w [n, k] as
// PackInt8Gemv laid it out: exact for any values and k up to 2^16, on BestGemvIsa() and
// BestGemvStreams(). Needs Int8GemvSupported().
void Int8Gemv(const int8_t* x, int64_t m, const uint8_t* packed, int64_t n, int64_t k, int32_t* y);
// The same on a named instruction set, which must be supported, and streams (the tests run each).
void Int8Gemv(GemvIsa isa, GemvStreams streams, const int8_t* x, int64_t m, const uint8_t* packed, int64_t n,
              int64_t k, int32_t* y);

// Int8Gemv's products dequantized: y[i, j] = float(product) * x_scales[i] * w_scales[j], in that
// order, the same bits as Matmul's epilogue gives oneDNN's products; done per block of columns
// while its products are in cache, rather than in a pass of its own.
void Int8GemvScaled(const int8_t* x, const float* x_scales, int64_t m, const uint8_t* packed, int64_t n, int64_t k,
                    const float* w_scales, float* y);
void Int8GemvScaled(GemvIsa isa, GemvStreams streams, const int8_t* x, const float* x_scales, int64_t m,
                    const uint8_t* packed, int64_t n, int64_t k, const float* w_scales, float* y);

// Int8GemvScaled's columns of blocks [block_begin, block_end) (64 columns a block, the last one
// short where n is not a multiple of 64), on the calling thread only; y's other columns are left as
// they are. For callers that hand a weight's blocks out among other work themselves: the columns
// hold the same bits as Int8GemvScaled gives them.
void Int8GemvScaledBlocks(const int8_t* x, const float* x_scales, int64_t m, const uint8_t* packed, int64_t n,
                          int64_t k, const float* w_scales, int64_t block_begin, int64_t block_end, float* y);

// biases[i] = 128 times the sum of x row i (x [m, k]): what a weight made unsigned (w + 128), as
// PackInt8Gemv makes it, adds to each of the row's products. Needs Int8GemvSupported().
void Int8RowBiases(const int8_t* x, int64_t m, int64_t k, int32_t* biases);

// oneDNN's GEMM (matmul.cc) on the weight as PackMatmulWeight lays it out: what Matmul runs above
// kInt8GemvMaxRows rows where Int8GemmAmx does not. Returns y, or, when m is not a size the GEMM
// was built for, the first m rows of a buffer of this thread that the next call reuses.
const int32_t* Int8GemmOneDnn(const int8_t* x, int64_t m, int64_t k, int64_t n, const void* packed, int32_t* y);

// Whether the CPU has AMX-INT8 and a [n, k] weight's shape suits Int8GemmAmx (k and n multiples of
// 64, k up to 2^16).
bool Int8GemmAmxSupported(int64_t k, int64_t n);

// y [m, n] (INT32, exact) = x [m, k] times the weight as PackInt8Gemv lays it out, on AMX tiles
// (int8_gemm_amx.cc): Matmul's GEMM above Int8Gemv's rows where it runs, so that one copy of the
// weight serves every batch. Needs Int8GemmAmxSupported(k, n) and Int8GemvSupported().
void Int8GemmAmx(const int8_t* x, int64_t m, int64_t k, int64_t n, const uint8_t* packed, int32_t* y);

// Int8GemmAmx's products dequantized: y[i, j] = float(product) * x_scales[i] * w_scales[j], in that
// order, the same bits as Matmul's epilogue.
void Int8GemmAmxScaled(const int8_t* x, const float* x_scales, int64_t m, int64_t k, int64_t n, const uint8_t* packed,
                       const float* w_scales, float* y);

}  // namespace moe::kernels::cpu
