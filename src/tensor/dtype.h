// Element types and the scalar conversions between them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moe {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kI8, kI32 };

size_t DTypeSize(DType dtype);
std::string_view DTypeName(DType dtype);  // safetensors spelling: "F32", "BF16", ...

struct bf16 {
  uint16_t bits;
};

inline float Bf16ToF32(bf16 v) { return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16); }

// Round to nearest even; NaN stays NaN.
inline bf16 F32ToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

float F16ToF32(uint16_t h);

// OCP FP8 E4M3 ("e4m3fn"): no infinities, S.1111.111 is NaN, bias 7.
float F8E4M3ToF32(uint8_t v);

}  // namespace moe
