// Internals of BatchInvariantMatmul, open to the tests, which run both loops against each other.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace moe::kernels::cpu {

// The order in which an output's products are summed (invariant_matmul.cc spells each out).
// kLanes: 16 interleaved partial sums by fused multiply-add, then a fixed pairwise tree; F32
// weights always, BF16 weights where the CPU lacks AVX512_BF16. kBf16Pairs: BF16 weights on CPUs
// with it -- the order of its VDPBF16PS dot product, twice as fast; the same tree. kAmxTiles: BF16
// weights on CPUs with AMX-BF16 -- one running sum in increasing k, as TDPBF16PS adds.
enum class SumOrder { kLanes, kBf16Pairs, kAmxTiles };

// What the public entry runs for BF16 weights: kAmxTiles where the CPU has AMX-BF16, else
// kBf16Pairs where it has AVX-512F and AVX512_BF16, else kLanes.
SumOrder BestSumOrder();

// Whether this CPU has the native loops of `order` (kLanes: AVX-512, or AVX2 and FMA; AVX-512 and
// AVX512_BF16 for kBf16Pairs; AMX-BF16 for kAmxTiles).
bool HasNativeLoops(SumOrder order);

// BatchInvariantMatmul with the order's native loops (`native`: HasNativeLoops must hold) or the
// generic ones. For a given order both loops give the same bits.
void BatchInvariantMatmul(bool native, SumOrder order, const float* x, int64_t m, const Weight& w, float* y);

}  // namespace moe::kernels::cpu
