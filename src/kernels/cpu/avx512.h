// The AVX-512 intrinsics, for files whose functions carry MOE_AVX512 instead of being built with
// -mavx512f, so that no inline function shared with other files is compiled for AVX-512.
#pragma once

#if defined(__x86_64__)

// GCC 12 warns, wrongly, that the placeholder operand many AVX-512 intrinsics start from with
// _mm512_undefined_*() is used uninitialized (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#define MOE_AVX512 __attribute__((target("avx512f")))
#define MOE_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define MOE_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

namespace moe::kernels::cpu {

// A vector loaded once for several FMAs. GCC would otherwise fold the load into every FMA that
// uses it, as a memory operand, issuing it once per use; on the machine measured (see
// bench/RESULTS.md) 512-bit loads, not FMAs, then set the pace.
MOE_AVX512 inline __m512 LoadOnce(const float* p) {
  __m512 v = _mm512_loadu_ps(p);
  asm("" : "+v"(v));
  return v;
}

// The same for 512 bits of integers (or BF16 pairs).
MOE_AVX512 inline __m512i LoadOnceBits(const void* p) {
  __m512i v = _mm512_loadu_si512(p);
  asm("" : "+v"(v));
  return v;
}

}  // namespace moe::kernels::cpu

#endif
