// The AVX-512 loops of Attention (see attention.cc for the algorithm). Only AVX-512F is needed.
//
// Per tile and group of kGroupRows rows: the scores as kGroupRows x 4 vectors of 16 keys, each
// transposed key vector loaded once for every row of the group and each query element broadcast
// once for every key vector (8 loads per 16 FMAs); then each row's online-softmax update; then the
// probability-weighted values, each value vector loaded once for every row of the group.
#include "kernels/cpu/attention.h"

#if defined(__x86_64__)

#include <algorithm>
#include <cmath>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/avx512_exp2.h"

namespace moe::kernels::cpu {
namespace {

constexpr int kGroupRows = 4;
constexpr int kTileVectors = kAttentionKeyTile / 16;
static_assert(kAttentionKeyTile % 16 == 0 && kAttentionQueryBlock % kGroupRows == 0);

// The per-block state in the scratch: m and l per row, one group's probabilities, O per row.
struct BlockState {
  BlockState(float* scratch, int64_t v_stride)
      : max(scratch),
        sum(max + kAttentionQueryBlock),
        probs(sum + kAttentionQueryBlock),
        out(probs + kGroupRows * kAttentionKeyTile),
        v_stride(v_stride) {}
  float* max;
  float* sum;
  float* probs;  // [kGroupRows][kAttentionKeyTile]
  float* out;    // [kAttentionQueryBlock][v_stride]
  int64_t v_stride;
};

__mmask16 FirstLanes(int64_t n) { return static_cast<__mmask16>((1u << std::clamp<int64_t>(n, 0, 16)) - 1); }

// scores[i][j] = q[i] · keys 16j..16j+15 of the tile.
MOE_AVX512 [[gnu::always_inline]] inline void GroupScores(const float* const (&q)[kGroupRows], const float* kt,
                                                          int64_t dim, __m512 (&scores)[kGroupRows][kTileVectors]) {
  for (auto& row : scores) {
    for (__m512& s : row) s = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < dim; ++d) {
    __m512 keys[kTileVectors];
    for (int j = 0; j < kTileVectors; ++j) keys[j] = LoadOnce(kt + d * kAttentionKeyTile + 16 * j);
    for (int i = 0; i < kGroupRows; ++i) {
      const __m512 qi = _mm512_set1_ps(q[i][d]);
      for (int j = 0; j < kTileVectors; ++j) scores[i][j] = _mm512_fmadd_ps(qi, keys[j], scores[i][j]);
    }
  }
}

// Row r of the block takes the tile's first `seen` keys (seen > 0) with base-2 scores `scores`:
// moves its max, rescales its sum and output, and leaves its probabilities in `probs`.
MOE_AVX512 [[gnu::always_inline]] inline void UpdateRow(const __m512 (&scores)[kTileVectors], float score_scale,
                                                        int64_t seen, int64_t r, const BlockState& state,
                                                        float* probs) {
  __m512 x[kTileVectors];
  __m512 tile_max = _mm512_set1_ps(-INFINITY);
  for (int j = 0; j < kTileVectors; ++j) {
    x[j] = _mm512_mul_ps(scores[j], _mm512_set1_ps(score_scale));
    tile_max = _mm512_mask_max_ps(tile_max, FirstLanes(seen - 16 * j), tile_max, x[j]);
  }
  const float old_max = state.max[r];
  const float new_max = std::max(old_max, _mm512_reduce_max_ps(tile_max));
  const float rescale = old_max == -INFINITY ? 0.0f : std::exp2(old_max - new_max);
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < kTileVectors; ++j) {
    const __m512 p = _mm512_maskz_mov_ps(FirstLanes(seen - 16 * j), Exp2(_mm512_sub_ps(x[j], _mm512_set1_ps(new_max))));
    _mm512_storeu_ps(probs + 16 * j, p);
    sum = _mm512_add_ps(sum, p);
  }
  state.max[r] = new_max;
  state.sum[r] = state.sum[r] * rescale + _mm512_reduce_add_ps(sum);
  if (rescale != 1.0f) {
    float* o = state.out + r * state.v_stride;
    for (int64_t c = 0; c < state.v_stride; c += 16) {
      _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), _mm512_set1_ps(rescale)));
    }
  }
}

// out[i][0..16 kVectors) += sum_j probs[i][j] * values[j][0..16 kVectors) for j < count.
template <int kVectors>
MOE_AVX512 void AccumulateValues(const float* probs, const float* values, int64_t v_stride, int64_t count,
                                 float* const (&out)[kGroupRows]) {
  __m512 acc[kGroupRows][kVectors];
  for (int i = 0; i < kGroupRows; ++i) {
    for (int u = 0; u < kVectors; ++u) acc[i][u] = _mm512_loadu_ps(out[i] + 16 * u);
  }
  for (int64_t j = 0; j < count; ++j) {
    __m512 v[kVectors];
    for (int u = 0; u < kVectors; ++u) v[u] = LoadOnce(values + j * v_stride + 16 * u);
    for (int i = 0; i < kGroupRows; ++i) {
      const __m512 p = _mm512_set1_ps(probs[i * kAttentionKeyTile + j]);
      for (int u = 0; u < kVectors; ++u) acc[i][u] = _mm512_fmadd_ps(p, v[u], acc[i][u]);
    }
  }
  for (int i = 0; i < kGroupRows; ++i) {
    for (int u = 0; u < kVectors; ++u) _mm512_storeu_ps(out[i] + 16 * u, acc[i][u]);
  }
}

// Rows [row, row + kGroupRows) of the block (past the block's rows: copies of its last row, into
// state rows of their own) against the tile of keys [first_key, first_key + count).
MOE_AVX512 void GroupTile(const QueryBlock& block, const HeadTiles& head, int64_t row, int64_t first_key,
                          int64_t count, const BlockState& state) {
  const float* q[kGroupRows];
  int64_t seen[kGroupRows];
  int64_t most_seen = 0;
  for (int i = 0; i < kGroupRows; ++i) {
    const int64_t real = std::min(row + i, block.rows - 1);
    q[i] = block.q + real * block.q_stride;
    seen[i] = std::clamp<int64_t>(block.first_position + real + 1 - first_key, 0, count);
    most_seen = std::max(most_seen, seen[i]);
  }
  if (most_seen == 0) return;
  __m512 scores[kGroupRows][kTileVectors];
  GroupScores(q, head.kt + first_key * head.qk_dim, head.qk_dim, scores);
  for (int i = 0; i < kGroupRows; ++i) {
    float* probs = state.probs + i * kAttentionKeyTile;
    if (seen[i] == 0) {
      std::fill(probs, probs + kAttentionKeyTile, 0.0f);
    } else {
      UpdateRow(scores[i], block.score_scale, seen[i], row + i, state, probs);
    }
  }
  const float* values = head.v + first_key * head.v_stride;
  for (int64_t c = 0; c < head.v_stride; c += 16 * kTileVectors) {
    float* const out[kGroupRows] = {state.out + row * head.v_stride + c, state.out + (row + 1) * head.v_stride + c,
                                    state.out + (row + 2) * head.v_stride + c,
                                    state.out + (row + 3) * head.v_stride + c};
    switch (std::min<int64_t>(kTileVectors, (head.v_stride - c) / 16)) {
      case 1: AccumulateValues<1>(state.probs, values + c, head.v_stride, most_seen, out); break;
      case 2: AccumulateValues<2>(state.probs, values + c, head.v_stride, most_seen, out); break;
      case 3: AccumulateValues<3>(state.probs, values + c, head.v_stride, most_seen, out); break;
      default: AccumulateValues<4>(state.probs, values + c, head.v_stride, most_seen, out); break;
    }
  }
}

}  // namespace

int64_t AttendBlockScratch(int64_t v_stride) {
  return 2 * kAttentionQueryBlock + kGroupRows * kAttentionKeyTile + kAttentionQueryBlock * v_stride;
}

MOE_AVX512 void AttendBlockAvx512(const QueryBlock& block, const HeadTiles& head, float* scratch) {
  const BlockState state(scratch, head.v_stride);
  std::fill(state.max, state.max + kAttentionQueryBlock, -INFINITY);
  std::fill(state.sum, state.sum + kAttentionQueryBlock, 0.0f);
  std::fill(state.out, state.out + kAttentionQueryBlock * head.v_stride, 0.0f);
  const int64_t keys = block.first_position + block.rows;  // what the last row sees
  for (int64_t first_key = 0; first_key < keys; first_key += kAttentionKeyTile) {
    const int64_t count = std::min(kAttentionKeyTile, keys - first_key);
    for (int64_t row = 0; row < block.rows; row += kGroupRows) GroupTile(block, head, row, first_key, count, state);
  }
  for (int64_t r = 0; r < block.rows; ++r) {
    const float* o = state.out + r * head.v_stride;
    float* dst = block.out + r * block.out_stride;
    for (int64_t i = 0; i < block.v_dim; ++i) dst[i] = o[i] / state.sum[r];
  }
}

}  // namespace moe::kernels::cpu

#endif
