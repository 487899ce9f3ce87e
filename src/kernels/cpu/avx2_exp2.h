// 2^x on 8 floats at once, for files whose functions carry MOE_AVX2: avx512_exp2.h's algorithm
// and accuracy without AVX-512.
#pragma once

#if defined(__x86_64__)

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/exp2_coefficient.h"

namespace moe::kernels::cpu {

// 2^x: x = i + f with i an integer and |f| <= 1/2, 2^f by the Taylor series of avx512_exp2.h. AVX2
// has no vscalefps, so 2^i is built in the exponent field, which holds only normal floats: as two
// factors 2^a * 2^b with a = floor(i / 2), b = i - a, both normal for i in [-160, 128]. The first
// product is exact (2^f 2^a stays normal), so the second rounds once, as vscalefps does, into a
// denormal or zero where the result falls that low, or to infinity above the float range. x is
// clamped to that range first: the results there are already 0 and Inf; NaN passes the clamp.
MOE_AVX2 inline __m256 Exp2(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(128.0f), _mm256_max_ps(_mm256_set1_ps(-160.0f), x));
  const __m256 i = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, i);
  __m256 p = _mm256_set1_ps(Exp2Coefficient(7));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(Exp2Coefficient(6)));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(Exp2Coefficient(5)));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(Exp2Coefficient(4)));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(Exp2Coefficient(3)));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(Exp2Coefficient(2)));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(Exp2Coefficient(1)));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i n = _mm256_cvtps_epi32(i);
  const __m256i a = _mm256_srai_epi32(n, 1);
  const __m256i b = _mm256_sub_epi32(n, a);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 scale_a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
  const __m256 scale_b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, scale_a), scale_b);
}

}  // namespace moe::kernels::cpu

#endif
