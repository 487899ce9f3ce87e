#include "tensor/dtype.h"

#include <cmath>
#include <limits>

#include "base/check.h"

namespace moe {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kI8: return 1;
    case DType::kI32: return 4;
  }
  MOE_CHECK(false, "unknown dtype %d", static_cast<int>(dtype));
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kI8: return "I8";
    case DType::kI32: return "I32";
  }
  MOE_CHECK(false, "unknown dtype %d", static_cast<int>(dtype));
  return "";
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

float F8E4M3ToF32(uint8_t v) {
  const bool negative = v & 0x80u;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float magnitude = exp == 0 ? std::ldexp(static_cast<float>(mant), -9)
                                   : std::ldexp(1.0f + mant / 8.0f, exp - 7);
  return negative ? -magnitude : magnitude;
}

}  // namespace moe
