// Internals of Matmul's I8 path, open to the tests and benchmarks: a hand-written kernel for a few
// activation rows, and the oneDNN one it stands in for.
#pragma once

#include <cstdint>

namespace moe::kernels::cpu {

// The most activation rows for which Matmul runs Int8Gemv rather than oneDNN's packed GEMM. On the
// bench model's expert and attention shapes, weights streamed from DRAM, 1 and 2 threads, Int8Gemv
// is 1.6-1.8x faster at 1-2 rows, 1.4-1.6x at 4, 1.1-1.3x at 8, even at 12 and 0.8x at 16.
inline constexpr int64_t kInt8GemvMaxRows = 8;

// Whether the CPU has what Int8Gemv needs: AVX-512F, AVX-512BW and AVX512_VNNI.
bool Int8GemvSupported();

// y[i, j] = sum over p of x[i, p] * w[j, p], in INT32, for x [m, k] and w [n, k] row-major: exact
// for any values and k up to 2^16. Needs Int8GemvSupported().
void Int8Gemv(const int8_t* x, int64_t m, const int8_t* w, int64_t n, int64_t k, int32_t* y);

// The same products by oneDNN's GEMM (matmul.cc) on `packed`, the weight as PackMatmulWeight lays
// it out: what Matmul runs above kInt8GemvMaxRows rows. Returns where they are: y, or, when m is
// not a size the GEMM was built for, the first m rows of a buffer of this thread that the next
// call reuses.
const int32_t* Int8GemmPacked(const int8_t* x, int64_t m, int64_t k, int64_t n, const void* packed, int32_t* y);

}  // namespace moe::kernels::cpu
