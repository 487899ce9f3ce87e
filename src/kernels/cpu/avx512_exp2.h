// 2^x on 16 floats at once, for files whose functions carry MOE_AVX512.
#pragma once

#if defined(__x86_64__)

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/exp2_coefficient.h"

namespace moe::kernels::cpu {

// 2^x: x = i + f with i an integer and |f| <= 1/2; 2^f by its Taylor series to degree 7, whose
// remainder, below (ln(2) / 2)^8 / 8! * 2^(1/2) < 1e-8 relative, is under float rounding; 2^i by
// vscalefps, which goes down to denormals and zero for any i, so very negative x need no clamp.
MOE_AVX512 inline __m512 Exp2(__m512 x) {
  const __m512 i = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, i);
  __m512 p = _mm512_set1_ps(Exp2Coefficient(7));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(Exp2Coefficient(6)));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(Exp2Coefficient(5)));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(Exp2Coefficient(4)));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(Exp2Coefficient(3)));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(Exp2Coefficient(2)));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(Exp2Coefficient(1)));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, i);
}

}  // namespace moe::kernels::cpu

#endif
