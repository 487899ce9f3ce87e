// The AVX-512 loops of Attention (see attention.cc for the algorithm). F32 products need only
// AVX-512F; BF16 products AVX512-BF16.
//
// Per tile and group of kGroupRows rows: the scores as kGroupRows x 4 vectors of 16 keys, each
// transposed key vector loaded once for every row of the group and each query element (F32) or
// pair (BF16) broadcast once for every key vector (8 loads per 16 FMAs or VDPBF16PS); then each
// row's online-softmax update; then the probability-weighted values, each value vector loaded once
// for every row of the group. VDPBF16PS does two products per lane where an FMA does one.
#include "kernels/cpu/attention.h"

#if defined(__x86_64__)

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/int_math.h"
#include "kernels/cpu/attention_softmax.h"

namespace moe::kernels::cpu {
namespace {

constexpr int kGroupRows = 4;
constexpr int kTileVectors = kAttentionTileVectors;
static_assert(kAttentionQueryBlock % kGroupRows == 0);

using ScoreTile = __m512[kGroupRows][kTileVectors];

// The per-block state in the scratch: m and l per row, one group's probabilities, O per row, and
// (BF16 products) the queries as BF16 pairs.
struct BlockState {
  BlockState(float* scratch, int64_t v_stride)
      : max(scratch),
        sum(max + kAttentionQueryBlock),
        probs(sum + kAttentionQueryBlock),
        out(probs + kGroupRows * kAttentionKeyTile),
        query_pairs(reinterpret_cast<uint32_t*>(out + kAttentionQueryBlock * v_stride)),
        v_stride(v_stride) {}
  float* max;
  float* sum;
  float* probs;  // [kGroupRows][kAttentionKeyTile]
  float* out;    // [kAttentionQueryBlock][v_stride]
  uint32_t* query_pairs;  // [kAttentionQueryBlock][ceil(qk_dim / 2)]
  int64_t v_stride;
};

// F32 products: the queries read in place, one element broadcast at a time.
struct F32Products {
  using Query = float;

  static const float* QueryRow(const QueryBlock& block, const BlockState&, int64_t, int64_t r) {
    return block.q + r * block.q_stride;
  }

  static void PrepareQueries(const QueryBlock&, int64_t, const BlockState&) {}

  // scores[i][j] = q[i] · keys 16j..16j+15 of the tile from first_key.
  MOE_AVX512 static void Scores(const float* const (&q)[kGroupRows], const HeadTiles& head, int64_t first_key,
                                ScoreTile& scores) {
    const float* kt = head.kt + first_key * head.qk_dim;
    ScoreTile acc;  // in registers, not through the reference
    for (auto& row : acc) {
      for (__m512& a : row) a = _mm512_setzero_ps();
    }
    for (int64_t d = 0; d < head.qk_dim; ++d) {
      __m512 keys[kTileVectors];
      for (int j = 0; j < kTileVectors; ++j) keys[j] = LoadOnce(kt + d * kAttentionKeyTile + 16 * j);
      for (int i = 0; i < kGroupRows; ++i) {
        const __m512 qi = _mm512_set1_ps(q[i][d]);
        for (int j = 0; j < kTileVectors; ++j) acc[i][j] = _mm512_fmadd_ps(qi, keys[j], acc[i][j]);
      }
    }
    std::memcpy(scores, acc, sizeof(acc));
  }

  // out[i][0..16 kVectors) += sum_j probs[i][j] * values[j][0..16 kVectors) for j < count.
  template <int kVectors>
  MOE_AVX512 static void AccumulateColumns(const float* probs, const float* values, int64_t v_stride, int64_t count,
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

  // out rows (v_stride floats each) += probs · the tile's first `count` values.
  MOE_AVX512 static void Accumulate(const float* probs, const HeadTiles& head, int64_t first_key, int64_t count,
                                    float* const (&out)[kGroupRows]) {
    const float* values = head.v + first_key * head.v_stride;
    for (int64_t c = 0; c < head.v_stride; c += 16 * kTileVectors) {
      float* const columns[kGroupRows] = {out[0] + c, out[1] + c, out[2] + c, out[3] + c};
      switch (std::min<int64_t>(kTileVectors, (head.v_stride - c) / 16)) {
        case 1: AccumulateColumns<1>(probs, values + c, head.v_stride, count, columns); break;
        case 2: AccumulateColumns<2>(probs, values + c, head.v_stride, count, columns); break;
        case 3: AccumulateColumns<3>(probs, values + c, head.v_stride, count, columns); break;
        default: AccumulateColumns<4>(probs, values + c, head.v_stride, count, columns); break;
      }
    }
  }
};

}  // namespace

MOE_AVX512_BF16 void RoundToPairs(const float* x, int64_t n, uint32_t* pairs) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i rounded =
        reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
    _mm512_storeu_si512(pairs + i / 2, rounded);
  }
  for (; i < n; i += 32) {
    const __m512 low = _mm512_maskz_loadu_ps(FirstLanes(n - i), x + i);
    const __m512 high = _mm512_maskz_loadu_ps(FirstLanes(n - i - 16), x + i + 16);
    const __m512i rounded = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(high, low));
    _mm512_mask_storeu_epi32(pairs + i / 2, FirstLanes(CeilDiv(n - i, 2)), rounded);
  }
}

namespace {

// BF16 products: queries rounded into BF16 pairs once per block, each pair broadcast as 32 bits.
struct Bf16Products {
  using Query = uint32_t;

  static const uint32_t* QueryRow(const QueryBlock&, const BlockState& state, int64_t qk_dim, int64_t r) {
    return state.query_pairs + r * CeilDiv(qk_dim, 2);
  }

  MOE_AVX512_BF16 static void PrepareQueries(const QueryBlock& block, int64_t qk_dim, const BlockState& state) {
    const int64_t pairs = CeilDiv(qk_dim, 2);
    for (int64_t r = 0; r < block.rows; ++r) {
      RoundToPairs(block.q + r * block.q_stride, qk_dim, state.query_pairs + r * pairs);
    }
  }

  MOE_AVX512_BF16 static void Scores(const uint32_t* const (&q)[kGroupRows], const HeadTiles& head,
                                     int64_t first_key, ScoreTile& scores) {
    const int64_t pairs = CeilDiv(head.qk_dim, 2);
    const bf16* kt = head.kt_pairs + first_key * KeyPairs(head.qk_dim) * 2;
    ScoreTile acc;
    for (auto& row : acc) {
      for (__m512& a : row) a = _mm512_setzero_ps();
    }
    for (int64_t d = 0; d < pairs; ++d) {
      __m512bh keys[kTileVectors];
      for (int j = 0; j < kTileVectors; ++j) {
        keys[j] = reinterpret_cast<__m512bh>(LoadOnceBits(kt + (d * kAttentionKeyTile + 16 * j) * 2));
      }
      for (int i = 0; i < kGroupRows; ++i) {
        const __m512bh qi = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int32_t>(q[i][d])));
        for (int j = 0; j < kTileVectors; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], qi, keys[j]);
      }
    }
    std::memcpy(scores, acc, sizeof(acc));
  }

  // out[i][0..16 kVectors) += sum over key pairs kp < pairs of (probs[i][2kp], probs[i][2kp+1]) ·
  // (values[2kp], values[2kp+1]), both as BF16 pairs.
  template <int kVectors>
  MOE_AVX512_BF16 static void AccumulateColumns(const uint32_t* prob_pairs, const bf16* values, int64_t v_stride,
                                                int64_t pairs, float* const (&out)[kGroupRows]) {
    __m512 acc[kGroupRows][kVectors];
    for (int i = 0; i < kGroupRows; ++i) {
      for (int u = 0; u < kVectors; ++u) acc[i][u] = _mm512_loadu_ps(out[i] + 16 * u);
    }
    for (int64_t kp = 0; kp < pairs; ++kp) {
      __m512bh v[kVectors];
      for (int u = 0; u < kVectors; ++u) {
        v[u] = reinterpret_cast<__m512bh>(LoadOnceBits(values + (kp * v_stride + 16 * u) * 2));
      }
      for (int i = 0; i < kGroupRows; ++i) {
        const __m512bh p = reinterpret_cast<__m512bh>(
            _mm512_set1_epi32(static_cast<int32_t>(prob_pairs[i * kAttentionKeyTile / 2 + kp])));
        for (int u = 0; u < kVectors; ++u) acc[i][u] = _mm512_dpbf16_ps(acc[i][u], p, v[u]);
      }
    }
    for (int i = 0; i < kGroupRows; ++i) {
      for (int u = 0; u < kVectors; ++u) _mm512_storeu_ps(out[i] + 16 * u, acc[i][u]);
    }
  }

  MOE_AVX512_BF16 static void Accumulate(const float* probs, const HeadTiles& head, int64_t first_key, int64_t count,
                                         float* const (&out)[kGroupRows]) {
    // The probabilities rounded to BF16; consecutive keys form the pairs.
    uint32_t prob_pairs[kGroupRows * kAttentionKeyTile / 2];
    for (int i = 0; i < kGroupRows; ++i) {
      for (int j = 0; j < kTileVectors; ++j) {
        const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(probs + i * kAttentionKeyTile + 16 * j));
        std::memcpy(prob_pairs + (i * kAttentionKeyTile + 16 * j) / 2, &rounded, sizeof(rounded));
      }
    }
    const int64_t pairs = CeilDiv(count, 2);
    const bf16* values = head.v_pairs + first_key * head.v_stride;
    for (int64_t c = 0; c < head.v_stride; c += 16 * kTileVectors) {
      float* const columns[kGroupRows] = {out[0] + c, out[1] + c, out[2] + c, out[3] + c};
      switch (std::min<int64_t>(kTileVectors, (head.v_stride - c) / 16)) {
        case 1: AccumulateColumns<1>(prob_pairs, values + 2 * c, head.v_stride, pairs, columns); break;
        case 2: AccumulateColumns<2>(prob_pairs, values + 2 * c, head.v_stride, pairs, columns); break;
        case 3: AccumulateColumns<3>(prob_pairs, values + 2 * c, head.v_stride, pairs, columns); break;
        default: AccumulateColumns<4>(prob_pairs, values + 2 * c, head.v_stride, pairs, columns); break;
      }
    }
  }
};

// Rows [row, row + kGroupRows) of the block (past the block's rows: copies of its last row, into
// state rows of their own) against the tile of keys [first_key, first_key + count).
template <class Products>
MOE_AVX512 void GroupTile(const QueryBlock& block, const HeadTiles& head, int64_t row, int64_t first_key,
                          int64_t count, const BlockState& state) {
  const typename Products::Query* q[kGroupRows];
  int64_t seen[kGroupRows];
  int64_t most_seen = 0;
  for (int i = 0; i < kGroupRows; ++i) {
    const int64_t real = std::min(row + i, block.rows - 1);
    q[i] = Products::QueryRow(block, state, head.qk_dim, real);
    seen[i] = std::clamp<int64_t>(block.first_position + real + 1 - first_key, 0, count);
    most_seen = std::max(most_seen, seen[i]);
  }
  if (most_seen == 0) return;
  ScoreTile scores;
  Products::Scores(q, head, first_key, scores);
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
  Products::Accumulate(state.probs, head, first_key, most_seen, out);
}

template <class Products>
MOE_AVX512 void AttendBlock(const QueryBlock& block, const HeadTiles& head, float* scratch) {
  const BlockState state(scratch, head.v_stride);
  std::fill(state.max, state.max + kAttentionQueryBlock, -INFINITY);
  std::fill(state.sum, state.sum + kAttentionQueryBlock, 0.0f);
  std::fill(state.out, state.out + kAttentionQueryBlock * head.v_stride, 0.0f);
  Products::PrepareQueries(block, head.qk_dim, state);
  const int64_t keys = block.first_position + block.rows;  // what the last row sees
  for (int64_t first_key = 0; first_key < keys; first_key += kAttentionKeyTile) {
    const int64_t count = std::min(kAttentionKeyTile, keys - first_key);
    for (int64_t row = 0; row < block.rows; row += kGroupRows) {
      GroupTile<Products>(block, head, row, first_key, count, state);
    }
  }
  for (int64_t r = 0; r < block.rows; ++r) {
    const float* o = state.out + r * head.v_stride;
    float* dst = block.out + r * block.out_stride;
    for (int64_t i = 0; i < block.v_dim; ++i) dst[i] = o[i] / state.sum[r];
  }
}

}  // namespace

int64_t AttendBlockScratch(int64_t qk_dim, int64_t v_stride) {
  return 2 * kAttentionQueryBlock + kGroupRows * kAttentionKeyTile + kAttentionQueryBlock * v_stride +
         kAttentionQueryBlock * CeilDiv(qk_dim, 2);
}

MOE_AVX512_BF16 void LayOutHeadPairsAvx512Bf16(const float* k, const float* v, const AttentionParams& p, int64_t h,
                                               int64_t v_stride, bf16* kt, bf16* vt) {
  const int64_t qk_pairs = KeyPairs(p.qk_dim);
  uint32_t* kt_words = reinterpret_cast<uint32_t*>(kt);
  std::vector<uint32_t> key(qk_pairs, 0u);
  for (int64_t s = 0; s < RoundUp(p.keys, kAttentionKeyTile); ++s) {
    if (s < p.keys) {
      RoundToPairs(k + (s * p.heads + h) * p.qk_dim, p.qk_dim, key.data());
    } else {
      std::fill(key.begin(), key.end(), 0u);
    }
    uint32_t* column = kt_words + s / kAttentionKeyTile * qk_pairs * kAttentionKeyTile + s % kAttentionKeyTile;
    for (int64_t d = 0; d < qk_pairs; ++d) column[d * kAttentionKeyTile] = key[d];
  }
  // Rows s and s + 1 interleaved: rounding each 16 values gives them in order; unpacking the two
  // interleaves them within 128-bit lanes, which the permutes put back in order.
  for (int64_t s = 0; s < p.keys; s += 2) {
    const float* first = v + (s * p.heads + h) * p.v_dim;
    const float* second = s + 1 < p.keys ? v + ((s + 1) * p.heads + h) * p.v_dim : nullptr;
    bf16* to = vt + s * v_stride;
    for (int64_t c = 0; c < v_stride; c += 16) {
      const __mmask16 lanes = FirstLanes(p.v_dim - c);
      const __m256i a = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(lanes, first + c)));
      const __m256i b = reinterpret_cast<__m256i>(
          _mm512_cvtneps_pbh(second ? _mm512_maskz_loadu_ps(lanes, second + c) : _mm512_setzero_ps()));
      const __m256i low = _mm256_unpacklo_epi16(a, b), high = _mm256_unpackhi_epi16(a, b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 2 * c), _mm256_permute2x128_si256(low, high, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 2 * c + 16), _mm256_permute2x128_si256(low, high, 0x31));
    }
  }
  // Zeros to the end of the last tile: weights of zero times a value must come out zero.
  std::fill(vt + RoundUp(p.keys, 2) * v_stride, vt + RoundUp(p.keys, kAttentionKeyTile) * v_stride, bf16{});
}

void AttendBlockAvx512(const QueryBlock& block, const HeadTiles& head, float* scratch) {
  AttendBlock<F32Products>(block, head, scratch);
}

void AttendBlockAvx512Bf16(const QueryBlock& block, const HeadTiles& head, float* scratch) {
  AttendBlock<Bf16Products>(block, head, scratch);
}

}  // namespace moe::kernels::cpu

#endif
