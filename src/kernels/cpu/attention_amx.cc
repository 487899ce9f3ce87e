// The AMX loops of Attention with BF16 products (see attention.cc for the algorithm): the scores and
// the weighted sums of a tile of keys as TDPBF16PS products, the online softmax between them in
// AVX-512, by the same UpdateRow as the AVX-512 loops.
//
// Per tile of kAttentionKeyTile keys and group of 16 query rows:
//   scores: 4 accumulator tiles, 16 rows x 16 keys each; A the queries, BF16 pairs row-major
//     (rounded once per block); B the keys exactly as HeadTiles::kt_pairs holds them, 16 pairs of a
//     key's dimensions by 16 keys, 256 bytes a row;
//   softmax: each row's scores through UpdateRow, its probabilities rounded to BF16;
//   weighted sums: per 16 output columns, the accumulator loaded from the block's F32 output rows,
//     A the probabilities of keys 0-31 and 32-63, B the values as HeadTiles::v_pairs holds them
//     (consecutive keys paired), stored back.
// Operands are rounded as the AVX-512 BF16 loops round them (queries, keys, values and
// probabilities to BF16, sums in F32), so the two agree with kernels/ref within the same bound.
//
// Independence from the batch: a tile's output row depends only on its A row and the B tile, and
// every output is summed by the same instructions in the same order whatever the other rows hold
// (rows past the block are zero queries whose results are dropped); keys past a row's position
// weigh exactly zero, and the values past the last key are zeros, never garbage times zero.
#include "kernels/cpu/attention.h"

#if defined(__x86_64__)

#include <algorithm>
#include <cmath>

#include "base/int_math.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/attention_softmax.h"

namespace moe::kernels::cpu {
namespace {

#define MOE_AMX_AVX512_BF16 __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))

constexpr int64_t kGroups = kAttentionQueryBlock / kAmxRows;   // groups of 16 query rows per block
constexpr int64_t kKeyTiles = kAttentionKeyTile / kAmxRows;     // accumulator tiles of 16 keys
constexpr int64_t kProbSteps = kAttentionKeyTile / kAmxK;       // A tiles of 32 probabilities
static_assert(kAttentionQueryBlock % kAmxRows == 0 && kKeyTiles == 4 && kProbSteps == 2);

// The block's state in the scratch (AttendBlockAmxScratch floats).
struct AmxBlockState {
  AmxBlockState(float* scratch, int64_t v_stride, int64_t key_pairs)
      : max(scratch),
        sum(max + kAttentionQueryBlock),
        scores(sum + kAttentionQueryBlock),
        probs(scores + kAmxRows * kAttentionKeyTile),
        out(probs + kAttentionKeyTile),
        prob_pairs(reinterpret_cast<bf16*>(out + kAttentionQueryBlock * v_stride)),
        query_pairs(reinterpret_cast<uint32_t*>(prob_pairs + kAmxRows * kAttentionKeyTile)),
        v_stride(v_stride),
        key_pairs(key_pairs) {}
  float* max;
  float* sum;
  float* scores;          // [kAmxRows][kAttentionKeyTile]: one group's
  float* probs;           // [kAttentionKeyTile]: one row's, F32
  float* out;             // [kAttentionQueryBlock][v_stride]
  bf16* prob_pairs;       // [kAmxRows][kAttentionKeyTile]: one group's, BF16
  uint32_t* query_pairs;  // [kAttentionQueryBlock][key_pairs]
  int64_t v_stride;
  int64_t key_pairs;
};

constexpr int64_t ScratchFloats(int64_t v_stride, int64_t key_pairs) {
  return 2 * kAttentionQueryBlock + kAmxRows * kAttentionKeyTile + kAttentionKeyTile +
         kAttentionQueryBlock * v_stride + kAmxRows * kAttentionKeyTile / 2 + kAttentionQueryBlock * key_pairs;
}

MOE_AMX void Configure() {
  static const TileConfig config;
  _tile_loadconfig(&config);
}

// Group g's raw scores against the tile from first_key, into state.scores.
MOE_AMX void GroupScores(const HeadTiles& head, int64_t g, int64_t first_key, const AmxBlockState& state) {
  const uint32_t* queries = state.query_pairs + g * kAmxRows * state.key_pairs;
  const bf16* keys = head.kt_pairs + first_key * state.key_pairs * 2;
  constexpr int kKeyRowBytes = kAttentionKeyTile * 2 * sizeof(bf16);
  const int64_t query_bytes = state.key_pairs * sizeof(uint32_t);
  ZeroAccumulators();
  for (int64_t s = 0; s < state.key_pairs; s += kAmxRows) {
    _tile_loadd(4, queries + s, query_bytes);
    const bf16* step = keys + s * kAttentionKeyTile * 2;
    _tile_loadd(5, step, kKeyRowBytes);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, step + 2 * kAmxRows, kKeyRowBytes);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(5, step + 4 * kAmxRows, kKeyRowBytes);
    _tile_dpbf16ps(2, 4, 5);
    _tile_loadd(6, step + 6 * kAmxRows, kKeyRowBytes);
    _tile_dpbf16ps(3, 4, 6);
  }
  constexpr int kScoreRowBytes = kAttentionKeyTile * sizeof(float);
  _tile_stored(0, state.scores, kScoreRowBytes);
  _tile_stored(1, state.scores + kAmxRows, kScoreRowBytes);
  _tile_stored(2, state.scores + 2 * kAmxRows, kScoreRowBytes);
  _tile_stored(3, state.scores + 3 * kAmxRows, kScoreRowBytes);
}

// Group g's output rows += its probabilities (state.prob_pairs) times the tile's values, 16 columns
// at a time. (Two accumulators in flight instead of one measured no faster: RESULTS.md.)
MOE_AMX void GroupValues(const HeadTiles& head, int64_t g, int64_t first_key, const AmxBlockState& state) {
  constexpr int kProbRowBytes = kAttentionKeyTile * sizeof(bf16);
  _tile_loadd(1, state.prob_pairs, kProbRowBytes);
  _tile_loadd(2, state.prob_pairs + kAmxK, kProbRowBytes);
  const int64_t row_bytes = state.v_stride * sizeof(float);  // an output row; also a pair of value rows
  float* out = state.out + g * kAmxRows * state.v_stride;
  const bf16* values = head.v_pairs + first_key * state.v_stride;
  const bf16* next_values = values + kAmxK * state.v_stride;
  for (int64_t c = 0; c < state.v_stride; c += kAmxRows) {
    _tile_loadd(0, out + c, row_bytes);
    _tile_loadd(3, values + 2 * c, row_bytes);
    _tile_loadd(4, next_values + 2 * c, row_bytes);
    _tile_dpbf16ps(0, 1, 3);
    _tile_dpbf16ps(0, 2, 4);
    _tile_stored(0, out + c, row_bytes);
  }
}

// Row i of group g: the online-softmax step, its probabilities rounded into state.prob_pairs
// (zeros for a row that sees none of the tile).
MOE_AMX_AVX512_BF16 void GroupSoftmaxRow(const QueryBlock& block, int64_t g, int64_t i, int64_t first_key,
                                         const AmxBlockState& state) {
  const int64_t r = g * kAmxRows + i;
  const int64_t seen = r < block.rows ? std::clamp<int64_t>(block.first_position + r + 1 - first_key, 0,
                                                            kAttentionKeyTile)
                                      : 0;
  bf16* pairs = state.prob_pairs + i * kAttentionKeyTile;
  if (seen == 0) {
    std::fill(pairs, pairs + kAttentionKeyTile, bf16{});
    return;
  }
  __m512 scores[kAttentionTileVectors];
  for (int j = 0; j < kAttentionTileVectors; ++j) scores[j] = _mm512_loadu_ps(state.scores + i * kAttentionKeyTile + 16 * j);
  UpdateRow(scores, block.score_scale, seen, state.max[r], state.sum[r], state.out + r * state.v_stride,
            state.v_stride, state.probs);
  for (int j = 0; j < kAttentionTileVectors; ++j) {
    const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(state.probs + 16 * j));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + 16 * j), reinterpret_cast<__m256i>(rounded));
  }
}

}  // namespace

int64_t AttendBlockAmxScratch(int64_t qk_dim, int64_t v_stride) { return ScratchFloats(v_stride, KeyPairs(qk_dim)); }

MOE_AMX_AVX512_BF16 void AttendBlockAmx(const QueryBlock& block, const HeadTiles& head, float* scratch) {
  const AmxBlockState state(scratch, head.v_stride, KeyPairs(head.qk_dim));
  std::fill(state.max, state.max + kAttentionQueryBlock, -INFINITY);
  std::fill(state.sum, state.sum + kAttentionQueryBlock, 0.0f);
  std::fill(state.out, state.out + kAttentionQueryBlock * head.v_stride, 0.0f);
  const int64_t groups = CeilDiv(block.rows, kAmxRows);
  std::fill(state.query_pairs, state.query_pairs + groups * kAmxRows * state.key_pairs, 0u);
  for (int64_t r = 0; r < block.rows; ++r) {
    RoundToPairs(block.q + r * block.q_stride, head.qk_dim, state.query_pairs + r * state.key_pairs);
  }
  Configure();
  const int64_t keys = block.first_position + block.rows;  // what the last row sees
  for (int64_t first_key = 0; first_key < keys; first_key += kAttentionKeyTile) {
    for (int64_t g = 0; g < groups; ++g) {
      // A group whose last row comes before the tile sees none of it.
      if (block.first_position + std::min(block.rows, (g + 1) * kAmxRows) <= first_key) continue;
      GroupScores(head, g, first_key, state);
      for (int64_t i = 0; i < kAmxRows; ++i) GroupSoftmaxRow(block, g, i, first_key, state);
      GroupValues(head, g, first_key, state);
    }
  }
  _tile_release();
  for (int64_t r = 0; r < block.rows; ++r) {
    const float* o = state.out + r * head.v_stride;
    float* dst = block.out + r * block.out_stride;
    for (int64_t i = 0; i < block.v_dim; ++i) dst[i] = o[i] / state.sum[r];
  }
}

}  // namespace moe::kernels::cpu

#else  // not x86-64: IsaSupported(kAmx) is false and these are never called.

namespace moe::kernels::cpu {
int64_t AttendBlockAmxScratch(int64_t, int64_t) { return 0; }
void AttendBlockAmx(const QueryBlock&, const HeadTiles&, float*) {}
}  // namespace moe::kernels::cpu

#endif
