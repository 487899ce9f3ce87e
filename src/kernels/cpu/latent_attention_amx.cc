// The AMX tile kernel of LatentAttention (see latent_attention.cc for the algorithm), for BF16
// caches: the scores and the weighted sums of a tile of keys as TDPBF16PS products.
//
// Rounding. The cached rows are BF16 already. The queries and the probabilities are F32; each goes
// into the tiles as two BF16 parts, the value rounded and what that rounding left, rounded again
// (16 significant bits in all), and both parts are multiplied and summed in F32. One BF16 part
// alone would cost 2^-9 relative on every score and weight -- measured, up to 4e-3 of the output
// scale against kernels/ref, and far more on scores of a hundred units -- against the F32
// kernels' 2^-24; with two, it is within 2e-5 of the output scale (1e-4 on scores of a hundred
// units; the F32 kernels: 1e-5), and the products, a fraction of the kernel's time, double.
//
// Forms. Scores: the tile's keys are the A operand as they lie ([key][dim], 16 keys x 32 values
// per tile), the queries the B operand, transposed once per SetQueries into pairs of values per
// query row; the product is scores transposed, 16 keys x 16 rows, turned around on the way out.
// Weighted sums: the probabilities of 16 rows are the A operand ([row][key]), the tile's values the
// B operand, their keys paired ([key pair][value][2], built once per tile), the outputs 16 rows x
// 16 values accumulated in place. Each output is computed by the same instructions in the same
// order whatever the other rows of its tiles hold, so a row does not depend on the others.
#include "kernels/cpu/latent_attention.h"

#if defined(__x86_64__)

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/int_math.h"
#include "kernels/cpu/amx.h"

namespace moe::kernels::cpu {
namespace {

#define MOE_AMX_AVX512 __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))

constexpr int64_t kKeyTiles = kKeyBlock / kAmxRows;  // 4 tiles of 16 keys
constexpr int64_t kPairTiles = kKeyBlock / kAmxK;    // 2 steps of 32 keys
static_assert(kKeyTiles == 4 && kPairTiles == 2);

// 16 F32 values rounded to BF16, to nearest even (the values here are finite).
MOE_AMX_AVX512 inline __m256i RoundToBf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

MOE_AMX_AVX512 inline __m512 Widen(__m256i x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

// Stores the 16 x 16 dwords of x (row n: x[n]) transposed: row i of `out` (16 dwords) holds dword
// i of every x[n], in order of n.
MOE_AMX_AVX512 inline void StoreTransposed(__m512i (&x)[kAmxRows], bf16* out) {
  __m512i a[kAmxRows], c[kAmxRows];
  // Interleaving dwords of row pairs, then qwords of those: lane L of a[4g + m] holds dword
  // 4L + m of rows 4g..4g+3.
  for (int j = 0; j < kAmxRows; j += 2) {
    c[j] = _mm512_unpacklo_epi32(x[j], x[j + 1]);
    c[j + 1] = _mm512_unpackhi_epi32(x[j], x[j + 1]);
  }
  for (int j = 0; j < kAmxRows; j += 4) {
    a[j] = _mm512_unpacklo_epi64(c[j], c[j + 2]);
    a[j + 1] = _mm512_unpackhi_epi64(c[j], c[j + 2]);
    a[j + 2] = _mm512_unpacklo_epi64(c[j + 1], c[j + 3]);
    a[j + 3] = _mm512_unpackhi_epi64(c[j + 1], c[j + 3]);
  }
  // Two rounds of lane selection put lane L of a[m], a[4 + m], a[8 + m], a[12 + m] (row groups
  // 0-3) side by side: row 4L + m of the output. First the even and odd lanes of group pairs:
  // c[m] = (g0, g1) of dwords m and 8 + m, c[4 + m] the same of 4 + m and 12 + m, c[8 + m] and
  // c[12 + m] likewise of groups 2 and 3.
  for (int m = 0; m < 4; ++m) {
    c[m] = _mm512_shuffle_i32x4(a[m], a[4 + m], 0x88);
    c[4 + m] = _mm512_shuffle_i32x4(a[m], a[4 + m], 0xdd);
    c[8 + m] = _mm512_shuffle_i32x4(a[8 + m], a[12 + m], 0x88);
    c[12 + m] = _mm512_shuffle_i32x4(a[8 + m], a[12 + m], 0xdd);
  }
  constexpr int64_t kRow = 2 * kAmxRows;  // BF16 values in 16 dwords
  for (int m = 0; m < 4; ++m) {
    _mm512_storeu_si512(out + m * kRow, _mm512_shuffle_i32x4(c[m], c[8 + m], 0x88));
    _mm512_storeu_si512(out + (8 + m) * kRow, _mm512_shuffle_i32x4(c[m], c[8 + m], 0xdd));
    _mm512_storeu_si512(out + (4 + m) * kRow, _mm512_shuffle_i32x4(c[4 + m], c[12 + m], 0x88));
    _mm512_storeu_si512(out + (12 + m) * kRow, _mm512_shuffle_i32x4(c[4 + m], c[12 + m], 0xdd));
  }
}

class AmxKeyTileKernel final : public KeyTileKernel {
 public:
  AmxKeyTileKernel(const LatentAttentionParams& p, int64_t max_rows)
      : p_(p),
        layout_(p),
        dim_(CeilDiv(layout_.dim, kAmxK) * kAmxK),
        steps_(dim_ / kAmxK),
        latent_steps_(p.kv_lora % kAmxK == 0 && p.rope % kAmxK == 0 ? p.kv_lora / kAmxK : steps_),
        queries_(CeilDiv(max_rows, kAmxRows) * steps_ * 2 * kAmxTileValues),
        keys_(kKeyBlock * dim_),
        zeros_(layout_.lora),
        values_(kKeyBlock * layout_.lora),
        probs_(2 * kAmxRows * kKeyBlock) {}

  ~AmxKeyTileKernel() override { Release(); }

  MOE_AMX_AVX512 void SetQueries(const float* q, int64_t rows) override {
    rows_ = rows;
    // Block b, step s, part (high, low): row i of the tile holds, for each query row n of the
    // block, its values 32 s + 2i and 32 s + 2i + 1 as one dword, at column n; the high part is the
    // value rounded to BF16, the low part what that left, rounded again. Columns past the last row
    // are zero. Each query row's 16 dwords of a step are one register; a block's 16 registers
    // transposed are the tile.
    const int64_t block_values = steps_ * 2 * kAmxTileValues;
    for (int64_t b = 0; b < CeilDiv(rows, kAmxRows); ++b) {
      for (int64_t s = 0; s < steps_; ++s) {
        const int64_t i = s * kAmxK;
        __m512i high[kAmxRows], low[kAmxRows];
        for (int64_t n = 0; n < kAmxRows; ++n) {
          const int64_t r = b * kAmxRows + n;
          if (r >= rows) {
            high[n] = low[n] = _mm512_setzero_si512();
            continue;
          }
          const float* row = q + r * layout_.dim;
          const __m512 x0 = _mm512_loadu_ps(row + i);
          const __m512 x1 = i + 16 < layout_.dim ? _mm512_loadu_ps(row + i + 16) : _mm512_setzero_ps();
          const __m256i h0 = RoundToBf16(x0), h1 = RoundToBf16(x1);
          const __m256i l0 = RoundToBf16(_mm512_sub_ps(x0, Widen(h0))), l1 = RoundToBf16(_mm512_sub_ps(x1, Widen(h1)));
          high[n] = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
          low[n] = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
        }
        bf16* tile = queries_.data() + b * block_values + 2 * s * kAmxTileValues;
        StoreTransposed(high, tile);
        StoreTransposed(low, tile + kAmxTileValues);
      }
    }
  }

  void LoadKeys(const float*, const float*, const LatentAttentionParams&, int64_t, int64_t) override {
    MOE_CHECK(false, "the AMX tile kernel takes BF16 caches only");
  }

  MOE_AMX_AVX512 void LoadKeys(const bf16* c_kv, const bf16* k_pe, const LatentAttentionParams& p, int64_t first,
                               int64_t count) override {
    // A tile of 16 keys whose rows lie in order in the cache (one block of a paged cache) is read
    // where it lies, when the rows split into whole steps (latent_steps_ of c_kv, the rest k_pe);
    // the others are copied into keys_. Rows of keys_ past count keep what an earlier tile left
    // there (finite, zero at first): their scores are not used and their probabilities are zero.
    const bool in_place = latent_steps_ * kAmxK == p_.kv_lora;
    for (int64_t t = 0; t < kKeyTiles; ++t) {
      const int64_t key = first + t * kAmxRows;
      KeyTile& tile = tiles_[t];
      const bool whole = (t + 1) * kAmxRows <= count;  // no key of the tile past the table's end
      if (in_place && whole && p.CacheRow(key + kAmxRows - 1) == p.CacheRow(key) + kAmxRows - 1) {
        const int64_t cache_row = p.CacheRow(key);
        tile = {c_kv + cache_row * p_.kv_lora, p_.kv_lora, k_pe + cache_row * p_.rope, p_.rope};
        continue;
      }
      bf16* rows = keys_.data() + t * kAmxRows * dim_;
      for (int64_t j = t * kAmxRows; j < std::min(count, t * kAmxRows + kAmxRows); ++j) {
        bf16* row = keys_.data() + j * dim_;
        const int64_t cache_row = p.CacheRow(first + j);
        std::memcpy(row, c_kv + cache_row * p_.kv_lora, p_.kv_lora * sizeof(bf16));
        std::memcpy(row + layout_.lora, k_pe + cache_row * p_.rope, p_.rope * sizeof(bf16));
      }
      tile = {rows, dim_, rows + latent_steps_ * kAmxK, dim_};
    }
    // Values with their keys paired: pair k, value d at values_[(k * lora + d) * 2 + {0, 1}]; keys
    // past count pair with zeros.
    auto latent_row = [&](int64_t j) -> const bf16* {
      if (j >= count) return zeros_.data();
      const KeyTile& tile = tiles_[j / kAmxRows];
      return tile.latent + j % kAmxRows * tile.latent_stride;
    };
    alignas(64) static constexpr uint16_t kInterleave[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,
                                                             37, 6, 38, 7, 39, 8,  40, 9,  41, 10, 42,
                                                             11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i interleave = _mm512_load_si512(kInterleave);
    for (int64_t k = 0; k < CeilDiv(count, 2); ++k) {
      const bf16* even = latent_row(2 * k);
      const bf16* odd = latent_row(2 * k + 1);
      bf16* out = values_.data() + k * layout_.lora * 2;
      for (int64_t d = 0; d < layout_.lora; d += 16) {
        const __m512i a = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + d)));
        const __m512i b = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(odd + d)));
        _mm512_storeu_si512(out + 2 * d, _mm512_permutex2var_epi16(a, interleave, b));
      }
    }
  }

  MOE_AMX_AVX512 void Scores(int64_t row_begin, float* scores) override {
    Configure();
    alignas(64) float block[kKeyTiles][kAmxRows][kAmxRows];  // [key tile][key][row]
    for (int64_t b = row_begin / kAmxRows; b < CeilDiv(rows_, kAmxRows); ++b) {
      const bf16* qb = queries_.data() + b * steps_ * 2 * kAmxTileValues;
      ZeroAccumulators();
      for (int64_t s = 0; s < steps_; ++s) {
        _tile_loadd(5, qb + 2 * s * kAmxTileValues, kAmxK * sizeof(bf16));
        _tile_loadd(6, qb + (2 * s + 1) * kAmxTileValues, kAmxK * sizeof(bf16));
        LoadKeyTile(0, s);
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(0, 4, 6);
        LoadKeyTile(1, s);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(1, 4, 6);
        LoadKeyTile(2, s);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(2, 4, 6);
        LoadKeyTile(3, s);
        _tile_dpbf16ps(3, 4, 5);
        _tile_dpbf16ps(3, 4, 6);
      }
      constexpr int kStride = kAmxRows * sizeof(float);
      _tile_stored(0, block[0], kStride);
      _tile_stored(1, block[1], kStride);
      _tile_stored(2, block[2], kStride);
      _tile_stored(3, block[3], kStride);
      for (int64_t n = 0; n < kAmxRows; ++n) {
        float* row = scores + (b * kAmxRows + n) * kKeyBlock;
        for (int64_t t = 0; t < kKeyTiles; ++t) {
          for (int64_t key = 0; key < kAmxRows; ++key) row[t * kAmxRows + key] = block[t][key][n];
        }
      }
    }
  }

  MOE_AMX_AVX512 void Accumulate(const float* p, const int64_t*, int64_t row_begin, float* o) override {
    Configure();
    const int64_t o_bytes = layout_.lora * sizeof(float), v_bytes = 2 * layout_.lora * sizeof(bf16);
    for (int64_t b = row_begin / kAmxRows; b < CeilDiv(rows_, kAmxRows); ++b) {
      // This block's probabilities as BF16 high and low parts; rows of finished tokens and past
      // the last row weigh 0.
      bf16* low = probs_.data() + kAmxRows * kKeyBlock;
      for (int64_t n = 0; n < kAmxRows; ++n) {
        const int64_t r = b * kAmxRows + n;
        for (int64_t j = 0; j < kKeyBlock; j += 16) {
          const __m512 x = r >= row_begin && r < rows_ ? _mm512_loadu_ps(p + r * kKeyBlock + j) : _mm512_setzero_ps();
          const __m256i high = RoundToBf16(x);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(probs_.data() + n * kKeyBlock + j), high);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(low + n * kKeyBlock + j),
                              RoundToBf16(_mm512_sub_ps(x, Widen(high))));
        }
      }
      constexpr int kProbBytes = kKeyBlock * sizeof(bf16);
      _tile_loadd(1, probs_.data(), kProbBytes);
      _tile_loadd(2, probs_.data() + kAmxK, kProbBytes);
      _tile_loadd(5, low, kProbBytes);
      _tile_loadd(6, low + kAmxK, kProbBytes);
      float* ob = o + b * kAmxRows * layout_.lora;
      for (int64_t d = 0; d < layout_.lora; d += kAmxRows) {
        _tile_loadd(0, ob + d, o_bytes);
        _tile_loadd(3, values_.data() + 2 * d, v_bytes);
        _tile_loadd(4, values_.data() + (kAmxRows * layout_.lora + d) * 2, v_bytes);
        _tile_dpbf16ps(0, 1, 3);
        _tile_dpbf16ps(0, 5, 3);
        _tile_dpbf16ps(0, 2, 4);
        _tile_dpbf16ps(0, 6, 4);
        _tile_stored(0, ob + d, o_bytes);
      }
    }
  }

 private:
  MOE_AMX void Configure() {
    static const TileConfig config;
    _tile_loadconfig(&config);
  }
  MOE_AMX void Release() { _tile_release(); }

  // Tile 4: key tile t's values of step s, from its latent rows or, past latent_steps_, its rope rows.
  MOE_AMX void LoadKeyTile(int64_t t, int64_t s) {
    const KeyTile& tile = tiles_[t];
    if (s < latent_steps_) {
      _tile_loadd(4, tile.latent + s * kAmxK, tile.latent_stride * sizeof(bf16));
    } else {
      _tile_loadd(4, tile.rope + (s - latent_steps_) * kAmxK, tile.rope_stride * sizeof(bf16));
    }
  }

  // Where a tile of 16 keys lies: rows latent_stride values apart from `latent`, and the rope parts
  // rope_stride apart from `rope` (in the cache, or in keys_).
  struct KeyTile {
    const bf16* latent;
    int64_t latent_stride;
    const bf16* rope;
    int64_t rope_stride;
  };

  const LatentAttentionParams p_;
  const RowLayout layout_;
  const int64_t dim_;    // the padded row, a multiple of kAmxK
  const int64_t steps_;  // of kAmxK values over dim_
  const int64_t latent_steps_;  // steps read from a tile's latent rows; the rest from its rope rows
  std::vector<bf16> queries_;  // B tiles: [row block][step][high, low]
  std::vector<bf16> keys_;     // [kKeyBlock, dim_], zeros in the padding
  std::vector<bf16> zeros_;    // [lora]: the values of keys past the tile's count
  KeyTile tiles_[kKeyTiles] = {};
  std::vector<bf16> values_;   // [kKeyBlock / 2, lora, 2]
  std::vector<bf16> probs_;    // [high, low][kAmxRows, kKeyBlock]: one row block's A tiles
  int64_t rows_ = 0;
};

}  // namespace

std::unique_ptr<KeyTileKernel> MakeAmxKeyTileKernel(const LatentAttentionParams& p, int64_t max_rows) {
  return std::make_unique<AmxKeyTileKernel>(p, max_rows);
}

}  // namespace moe::kernels::cpu

#else  // not x86-64: IsaSupported(kAmx) is false and this is never called.

namespace moe::kernels::cpu {
std::unique_ptr<KeyTileKernel> MakeAmxKeyTileKernel(const LatentAttentionParams&, int64_t) { return nullptr; }
}  // namespace moe::kernels::cpu

#endif
