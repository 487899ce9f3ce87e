// The AVX2 and FMA intrinsics, for files whose functions carry MOE_AVX2 instead of being built with
// -mavx2, so that no inline function shared with other files is compiled for AVX2.
#pragma once

#if defined(__x86_64__)

// As in avx512.h (GCC bug 105593): whichever of the two headers includes immintrin.h first decides
// whether a file's AVX-512 intrinsics warn.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#define MOE_AVX2 __attribute__((target("avx2,fma")))

namespace moe::kernels::cpu {

// A vector loaded once for several FMAs, as LoadOnce in avx512.h: GCC would otherwise fold the
// load into every FMA that uses it, issuing it once per use.
MOE_AVX2 inline __m256 LoadOnce256(const float* p) {
  __m256 v = _mm256_loadu_ps(p);
  asm("" : "+v"(v));
  return v;
}

// Lanes [0, n) of 8 set, for any n (none when n <= 0, all when n >= 8), as AVX2's masked loads,
// stores and blends take them.
MOE_AVX2 inline __m256i FirstLanes256(int64_t n) {
  const int32_t lanes = static_cast<int32_t>(n < 0 ? 0 : n > 8 ? 8 : n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The sum of the 8 lanes: the 128-bit halves, then pairs, then neighbours.
MOE_AVX2 inline float Sum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The largest of the 8 lanes, the same way.
MOE_AVX2 inline float Max256(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace moe::kernels::cpu

#endif
