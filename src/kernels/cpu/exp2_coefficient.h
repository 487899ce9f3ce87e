// The Taylor coefficients of the vector Exp2s (avx512_exp2.h, avx2_exp2.h), which evaluate the same
// polynomial so that their ISA tiers agree.
#pragma once

#include <numbers>

namespace moe::kernels::cpu {

// The Taylor coefficient ln(2)^k / k! of 2^f = e^(f ln 2).
constexpr float Exp2Coefficient(int k) {
  double c = 1.0;
  for (int i = 1; i <= k; ++i) c *= std::numbers::ln2 / i;
  return static_cast<float>(c);
}

}  // namespace moe::kernels::cpu
