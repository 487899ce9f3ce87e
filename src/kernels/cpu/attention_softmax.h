// The online-softmax step of Attention's tile loops (see attention.cc), shared by the AVX-512 and
// AMX variants so that both move a row's state by the same arithmetic.
#pragma once

#if defined(__x86_64__)

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/avx512_exp2.h"

namespace moe::kernels::cpu {

inline constexpr int kAttentionTileVectors = kAttentionKeyTile / 16;
static_assert(kAttentionKeyTile % 16 == 0);

inline __mmask16 FirstLanes(int64_t n) { return static_cast<__mmask16>((1u << std::clamp<int64_t>(n, 0, 16)) - 1); }

// One query row takes the tile's first `seen` keys (seen > 0) with raw scores `scores`: moves its
// max, rescales its sum and its output row (v_stride floats), and leaves the tile's probabilities
// in `probs` (zero past `seen`).
MOE_AVX512 [[gnu::always_inline]] inline void UpdateRow(const __m512 (&scores)[kAttentionTileVectors],
                                                        float score_scale, int64_t seen, float& max, float& sum,
                                                        float* out, int64_t v_stride, float* probs) {
  __m512 x[kAttentionTileVectors];
  __m512 tile_max = _mm512_set1_ps(-INFINITY);
  for (int j = 0; j < kAttentionTileVectors; ++j) {
    x[j] = _mm512_mul_ps(scores[j], _mm512_set1_ps(score_scale));
    tile_max = _mm512_mask_max_ps(tile_max, FirstLanes(seen - 16 * j), tile_max, x[j]);
  }
  const float old_max = max;
  const float new_max = std::max(old_max, _mm512_reduce_max_ps(tile_max));
  const float rescale = old_max == -INFINITY ? 0.0f : std::exp2(old_max - new_max);
  __m512 tile_sum = _mm512_setzero_ps();
  for (int j = 0; j < kAttentionTileVectors; ++j) {
    const __m512 p = _mm512_maskz_mov_ps(FirstLanes(seen - 16 * j), Exp2(_mm512_sub_ps(x[j], _mm512_set1_ps(new_max))));
    _mm512_storeu_ps(probs + 16 * j, p);
    tile_sum = _mm512_add_ps(tile_sum, p);
  }
  max = new_max;
  sum = sum * rescale + _mm512_reduce_add_ps(tile_sum);
  if (rescale != 1.0f) {
    for (int64_t c = 0; c < v_stride; c += 16) {
      _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_loadu_ps(out + c), _mm512_set1_ps(rescale)));
    }
  }
}

}  // namespace moe::kernels::cpu

#endif
