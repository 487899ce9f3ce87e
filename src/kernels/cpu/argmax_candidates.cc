#include "kernels/cpu/argmax_candidates.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "base/check.h"
#include "base/int_math.h"
#include "kernels/cpu/avx512.h"

namespace moe::kernels::cpu {
namespace {

// One pass finds the threshold (the largest lower end) and the largest upper end of each block of
// 256 columns; the second visits only the blocks whose upper ends reach the threshold.
constexpr int64_t kBlock = 256;
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

void MaxCandidatesGeneric(const float* first, const float* row_norms, int64_t n, float bound,
                          std::vector<int32_t>& out) {
  constexpr int kLanes = 16;  // running maxima the compiler keeps in vector registers
  std::vector<float> block_upper(CeilDiv(n, kBlock));
  float lower[kLanes];
  std::fill_n(lower, kLanes, kMinusInf);
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    float upper[kLanes];
    std::fill_n(upper, kLanes, kMinusInf);
    int64_t j = begin;
    for (; j + kLanes <= end; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const float f = first[j + l], margin = bound * row_norms[j + l];
        lower[l] = std::max(lower[l], f - margin);
        upper[l] = std::max(upper[l], f + margin);
      }
    }
    for (; j < end; ++j) {
      lower[0] = std::max(lower[0], first[j] - bound * row_norms[j]);
      upper[0] = std::max(upper[0], first[j] + bound * row_norms[j]);
    }
    block_upper[begin / kBlock] = *std::max_element(upper, upper + kLanes);
  }
  const float threshold = *std::max_element(lower, lower + kLanes);
  out.clear();
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    if (block_upper[begin / kBlock] < threshold) continue;
    for (int64_t j = begin; j < std::min(n, begin + kBlock); ++j) {
      if (first[j] + bound * row_norms[j] >= threshold) out.push_back(static_cast<int32_t>(j));
    }
  }
}

int32_t DotInt8Generic(const int8_t* a, const int8_t* b, int64_t k) {
  int32_t sum = 0;
  for (int64_t p = 0; p < k; ++p) sum += int32_t{a[p]} * int32_t{b[p]};
  return sum;
}

#if defined(__x86_64__)

constexpr int64_t kLanes = 16;

__mmask16 FirstLanes(int64_t count) {
  return static_cast<__mmask16>(count >= kLanes ? 0xffff : (1u << count) - 1);
}

// bound * row_norms[j] for 16 columns, rounded as a product of its own: the generic variant's
// subtraction and addition must not fuse with it, or a column at the threshold could land on the
// other side.
MOE_AVX512 inline __m512 Margins(__m512 bound, __mmask16 lanes, const float* row_norms) {
  __m512 margin = _mm512_mul_ps(bound, _mm512_maskz_loadu_ps(lanes, row_norms));
  asm("" : "+v"(margin));
  return margin;
}

// Maxima as the generic variant's std::max(running, value) takes them: a NaN value leaves the
// running maximum (VMAXPS returns its second operand when either is NaN); lanes past n stay -inf.
MOE_AVX512 void MaxCandidatesAvx512(const float* first, const float* row_norms, int64_t n, float bound,
                                    std::vector<int32_t>& out) {
  const __m512 vbound = _mm512_set1_ps(bound), minus_inf = _mm512_set1_ps(kMinusInf);
  std::vector<float> block_upper(CeilDiv(n, kBlock));
  __m512 lower = minus_inf;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    __m512 upper = minus_inf;
    for (int64_t j = begin; j < std::min(n, begin + kBlock); j += kLanes) {
      const __mmask16 lanes = FirstLanes(n - j);
      const __m512 f = _mm512_maskz_loadu_ps(lanes, first + j);
      const __m512 margin = Margins(vbound, lanes, row_norms + j);
      lower = _mm512_mask_max_ps(lower, lanes, _mm512_sub_ps(f, margin), lower);
      upper = _mm512_mask_max_ps(upper, lanes, _mm512_add_ps(f, margin), upper);
    }
    block_upper[begin / kBlock] = _mm512_reduce_max_ps(upper);
  }
  const float threshold = _mm512_reduce_max_ps(lower);
  const __m512 vthreshold = _mm512_set1_ps(threshold);
  out.clear();
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    if (block_upper[begin / kBlock] < threshold) continue;
    for (int64_t j = begin; j < std::min(n, begin + kBlock); j += kLanes) {
      const __mmask16 lanes = FirstLanes(n - j);
      const __m512 f = _mm512_maskz_loadu_ps(lanes, first + j);
      const __m512 upper = _mm512_add_ps(f, Margins(vbound, lanes, row_norms + j));
      for (uint32_t hits = _mm512_mask_cmp_ps_mask(lanes, upper, vthreshold, _CMP_GE_OQ); hits != 0;
           hits &= hits - 1) {
        out.push_back(static_cast<int32_t>(j + std::countr_zero(hits)));
      }
    }
  }
}

MOE_AVX512 int32_t DotInt8Avx512(const int8_t* a, const int8_t* b, int64_t k) {
  __m512i sums = _mm512_setzero_si512();
  int64_t p = 0;
  for (; p + kLanes <= k; p += kLanes) {
    const __m512i x = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + p)));
    const __m512i y = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + p)));
    sums = _mm512_add_epi32(sums, _mm512_mullo_epi32(x, y));
  }
  return _mm512_reduce_add_epi32(sums) + DotInt8Generic(a + p, b + p, k - p);
}

#endif

}  // namespace

void MaxCandidates(Isa isa, const float* first, const float* row_norms, int64_t n, float bound,
                   std::vector<int32_t>& out) {
  MOE_CHECK(IsaSupported(isa), "MaxCandidates: this CPU lacks the instruction set asked for");
#if defined(__x86_64__)
  // No AVX2 variant: kAvx2 runs the generic loop.
  if (isa == Isa::kAvx512 || isa == Isa::kAmx) return MaxCandidatesAvx512(first, row_norms, n, bound, out);
#endif
  MaxCandidatesGeneric(first, row_norms, n, bound, out);
}

int32_t DotInt8(Isa isa, const int8_t* a, const int8_t* b, int64_t k) {
  MOE_CHECK(IsaSupported(isa), "DotInt8: this CPU lacks the instruction set asked for");
#if defined(__x86_64__)
  if (isa == Isa::kAvx512 || isa == Isa::kAmx) return DotInt8Avx512(a, b, k);
#endif
  return DotInt8Generic(a, b, k);
}

Isa BestArgmaxIsa() {
  static const Isa best = IsaSupported(Isa::kAvx512) ? Isa::kAvx512 : Isa::kGeneric;
  return best;
}

}  // namespace moe::kernels::cpu
