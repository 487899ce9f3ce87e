// The AVX2 loops of Attention (see attention.cc for the algorithm), for CPUs without AVX-512: F32
// products only (BF16 products need AVX512-BF16; UsesBf16Products is false here), on the F32
// HeadTiles that attention_avx512.cc reads, 8 keys or value columns to a vector.
//
// Per tile and group of kGroupRows rows: the scores, kScoreVectors vectors of 8 keys at a time
// (the 16 registers do not hold the whole tile's accumulators as AVX-512's 32 do), each transposed
// key vector loaded once for every row of the group and each query element broadcast once for
// every key vector of the pass; then each row's online-softmax update; then the probability-
// weighted values, 3 value vectors at a time, each loaded once for every row of the group.
#include "kernels/cpu/attention.h"

#if defined(__x86_64__)

#include <algorithm>
#include <cmath>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/avx2_exp2.h"

namespace moe::kernels::cpu {
namespace {

constexpr int kGroupRows = 4;
constexpr int kTileVectors = kAttentionKeyTile / 8;
constexpr int kScoreVectors = 2;  // 8 accumulators, 2 key vectors and a broadcast
constexpr int kValueVectors = 3;  // 12 accumulators, 3 value vectors and a broadcast
static_assert(kAttentionQueryBlock % kGroupRows == 0 && kTileVectors % kScoreVectors == 0);

using ScoreTile = __m256[kGroupRows][kTileVectors];

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

// scores[i][j] = q[i] · keys 8j..8j+7 of the tile from first_key, for the vectors that hold one
// of its first `keys` keys; the others are zero.
MOE_AVX2 void Scores(const float* const (&q)[kGroupRows], const HeadTiles& head, int64_t first_key, int64_t keys,
                     ScoreTile& scores) {
  const float* kt = head.kt + first_key * head.qk_dim;
  for (int j0 = 0; j0 < kTileVectors; j0 += kScoreVectors) {
    __m256 acc[kGroupRows][kScoreVectors];
    for (auto& row : acc) {
      for (__m256& a : row) a = _mm256_setzero_ps();
    }
    // Keys no row sees weigh zero whatever their scores: a causal block's last tile skips them.
    if (8 * j0 < keys) {
      for (int64_t d = 0; d < head.qk_dim; ++d) {
        __m256 k[kScoreVectors];
        for (int j = 0; j < kScoreVectors; ++j) k[j] = LoadOnce256(kt + d * kAttentionKeyTile + 8 * (j0 + j));
        for (int i = 0; i < kGroupRows; ++i) {
          const __m256 qi = _mm256_broadcast_ss(q[i] + d);
          for (int j = 0; j < kScoreVectors; ++j) acc[i][j] = _mm256_fmadd_ps(qi, k[j], acc[i][j]);
        }
      }
    }
    for (int i = 0; i < kGroupRows; ++i) {
      for (int j = 0; j < kScoreVectors; ++j) scores[i][j0 + j] = acc[i][j];
    }
  }
}

// attention_softmax.h's UpdateRow on 8-float vectors: one query row takes the tile's first `seen`
// keys (seen > 0) with raw scores `scores`: moves its max, rescales its sum and its output row
// (v_stride floats), and leaves the tile's probabilities in `probs` (zero past `seen`).
MOE_AVX2 void UpdateRow(const __m256 (&scores)[kTileVectors], float score_scale, int64_t seen, float& max,
                        float& sum, float* out, int64_t v_stride, float* probs) {
  __m256 x[kTileVectors];
  const __m256 none = _mm256_set1_ps(-INFINITY);
  __m256 tile_max = none;
  for (int j = 0; j < kTileVectors; ++j) {
    x[j] = _mm256_mul_ps(scores[j], _mm256_set1_ps(score_scale));
    const __m256 seen_lanes = _mm256_castsi256_ps(FirstLanes256(seen - 8 * j));
    tile_max = _mm256_max_ps(tile_max, _mm256_blendv_ps(none, x[j], seen_lanes));
  }
  const float old_max = max;
  const float new_max = std::max(old_max, Max256(tile_max));
  const float rescale = old_max == -INFINITY ? 0.0f : std::exp2(old_max - new_max);
  __m256 tile_sum = _mm256_setzero_ps();
  for (int j = 0; j < kTileVectors; ++j) {
    const __m256 seen_lanes = _mm256_castsi256_ps(FirstLanes256(seen - 8 * j));
    const __m256 p = _mm256_and_ps(seen_lanes, Exp2(_mm256_sub_ps(x[j], _mm256_set1_ps(new_max))));
    _mm256_storeu_ps(probs + 8 * j, p);
    tile_sum = _mm256_add_ps(tile_sum, p);
  }
  max = new_max;
  sum = sum * rescale + Sum256(tile_sum);
  if (rescale != 1.0f) {
    for (int64_t c = 0; c < v_stride; c += 8) {
      _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_loadu_ps(out + c), _mm256_set1_ps(rescale)));
    }
  }
}

// out[i][0..8 kVectors) += sum_j probs[i][j] * values[j][0..8 kVectors) for j < count.
template <int kVectors>
MOE_AVX2 void AccumulateColumns(const float* probs, const float* values, int64_t v_stride, int64_t count,
                                float* const (&out)[kGroupRows]) {
  __m256 acc[kGroupRows][kVectors];
  for (int i = 0; i < kGroupRows; ++i) {
    for (int u = 0; u < kVectors; ++u) acc[i][u] = _mm256_loadu_ps(out[i] + 8 * u);
  }
  for (int64_t j = 0; j < count; ++j) {
    __m256 v[kVectors];
    for (int u = 0; u < kVectors; ++u) v[u] = LoadOnce256(values + j * v_stride + 8 * u);
    for (int i = 0; i < kGroupRows; ++i) {
      const __m256 p = _mm256_broadcast_ss(probs + i * kAttentionKeyTile + j);
      for (int u = 0; u < kVectors; ++u) acc[i][u] = _mm256_fmadd_ps(p, v[u], acc[i][u]);
    }
  }
  for (int i = 0; i < kGroupRows; ++i) {
    for (int u = 0; u < kVectors; ++u) _mm256_storeu_ps(out[i] + 8 * u, acc[i][u]);
  }
}

// out rows (v_stride floats each) += probs · the tile's first `count` values.
MOE_AVX2 void Accumulate(const float* probs, const HeadTiles& head, int64_t first_key, int64_t count,
                         float* const (&out)[kGroupRows]) {
  const float* values = head.v + first_key * head.v_stride;
  for (int64_t c = 0; c < head.v_stride; c += 8 * kValueVectors) {
    float* const columns[kGroupRows] = {out[0] + c, out[1] + c, out[2] + c, out[3] + c};
    switch (std::min<int64_t>(kValueVectors, (head.v_stride - c) / 8)) {
      case 1: AccumulateColumns<1>(probs, values + c, head.v_stride, count, columns); break;
      case 2: AccumulateColumns<2>(probs, values + c, head.v_stride, count, columns); break;
      default: AccumulateColumns<3>(probs, values + c, head.v_stride, count, columns); break;
    }
  }
}

// Rows [row, row + kGroupRows) of the block (past the block's rows: copies of its last row, into
// state rows of their own) against the tile of keys [first_key, first_key + count).
MOE_AVX2 void GroupTile(const QueryBlock& block, const HeadTiles& head, int64_t row, int64_t first_key,
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
  ScoreTile scores;
  Scores(q, head, first_key, most_seen, scores);
  for (int i = 0; i < kGroupRows; ++i) {
    float* probs = state.probs + i * kAttentionKeyTile;
    if (seen[i] == 0) {
      std::fill(probs, probs + kAttentionKeyTile, 0.0f);
    } else {
      const int64_t r = row + i;
      UpdateRow(scores[i], block.score_scale, seen[i], state.max[r], state.sum[r], state.out + r * state.v_stride,
                state.v_stride, probs);
    }
  }
  float* const out[kGroupRows] = {state.out + row * head.v_stride, state.out + (row + 1) * head.v_stride,
                                  state.out + (row + 2) * head.v_stride, state.out + (row + 3) * head.v_stride};
  Accumulate(state.probs, head, first_key, most_seen, out);
}

}  // namespace

int64_t AttendBlockAvx2Scratch(int64_t v_stride) {
  return 2 * kAttentionQueryBlock + kGroupRows * kAttentionKeyTile + kAttentionQueryBlock * v_stride;
}

MOE_AVX2 void AttendBlockAvx2(const QueryBlock& block, const HeadTiles& head, float* scratch) {
  const BlockState state(scratch, head.v_stride);
  std::fill(state.max, state.max + kAttentionQueryBlock, -INFINITY);
  std::fill(state.sum, state.sum + kAttentionQueryBlock, 0.0f);
  std::fill(state.out, state.out + kAttentionQueryBlock * head.v_stride, 0.0f);
  const int64_t keys = block.first_position + block.rows;  // what the last row sees
  for (int64_t first_key = 0; first_key < keys; first_key += kAttentionKeyTile) {
    const int64_t count = std::min(kAttentionKeyTile, keys - first_key);
    for (int64_t row = 0; row < block.rows; row += kGroupRows) {
      GroupTile(block, head, row, first_key, count, state);
    }
  }
  for (int64_t r = 0; r < block.rows; ++r) {
    const float* o = state.out + r * head.v_stride;
    float* dst = block.out + r * block.out_stride;
    for (int64_t i = 0; i < block.v_dim; ++i) dst[i] = o[i] / state.sum[r];
  }
}

}  // namespace moe::kernels::cpu

#else  // not x86-64: IsaSupported(kAvx2) is false and these are never called.

namespace moe::kernels::cpu {
int64_t AttendBlockAvx2Scratch(int64_t) { return 0; }
void AttendBlockAvx2(const QueryBlock&, const HeadTiles&, float*) {}
}  // namespace moe::kernels::cpu

#endif
