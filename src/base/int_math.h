// Integer rounding for sizes and counts.
#pragma once

#include <cstdint>

namespace moe {

// a / b rounded up, for a >= 0 and b > 0.
inline constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// a rounded up to a multiple of b, for a >= 0 and b > 0.
inline constexpr int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

}  // namespace moe
