// Internals of BatchInvariantMatmul, open to the tests, which run both loops against each other.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace moe::kernels::cpu {

// The order in which an output's products are summed (invariant_matmul.cc spells both out).
// kLanes: 16 interleaved partial sums by fused multiply-add, then a fixed pairwise tree; F32
// weights always, BF16 weights where the CPU lacks AVX512_BF16. kBf16Pairs: BF16 weights on CPUs
// with it -- the order of its VDPBF16PS dot product, twice as fast; the same tree.
enum class SumOrder { kLanes, kBf16Pairs };

// kBf16Pairs where the CPU has AVX-512F and AVX512_BF16, else kLanes: what the public entry runs.
SumOrder BestSumOrder();

// BatchInvariantMatmul with the AVX-512 loops (`avx512`, which the CPU must support, with
// AVX512_BF16 for kBf16Pairs) or the generic ones, in a given order. For a given order both
// loops give the same bits.
void BatchInvariantMatmul(bool avx512, SumOrder order, const float* x, int64_t m, const Weight& w, float* y);

}  // namespace moe::kernels::cpu
