// Internals of the CPU LatentAttention kernel, shared by its ISA variants and open to the tests,
// which run every variant the machine supports against kernels/ref.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"

namespace moe::kernels::cpu {

// Rows are padded with zeros to a multiple of kLatentLanes floats, so the loops need no tails over
// the dimension.
inline constexpr int64_t kLatentLanes = 16;
// Keys per tile. Tiles start at multiples of kKeyBlock of the cache, whoever asks.
inline constexpr int64_t kKeyBlock = 64;

// Where the parts of a padded row sit: [c_kv, 0... | k_pe, 0...].
struct RowLayout {
  explicit RowLayout(const LatentAttentionParams& p);
  int64_t lora;  // the padded width of c_kv, and of the outputs
  int64_t dim;   // the padded width of a row
};

// The elementwise inner loops, per ISA.
struct LatentOps {
  // dst[0..count) = src[0..count) widened to F32.
  void (*widen)(const bf16* src, int64_t count, float* dst);
  // scores[h * score_stride + j] = q[h]·keys[j] over `dim` floats, for h < heads, j < count.
  void (*scores)(const float* q, int64_t heads, const float* keys, int64_t count, int64_t dim,
                 float* scores, int64_t score_stride);
  // The largest of x[0..count), count > 0.
  float (*max)(const float* x, int64_t count);
  // x[j] = 2^(x[j] - ref) for j < count; returns their sum.
  float (*exp2_sum)(float* x, int64_t count, float ref);
  // out[h][0..width) += sum_j p[h * p_stride + j] * keys[j][0..width), rows of `dim` floats.
  void (*accumulate)(const float* p, int64_t p_stride, int64_t heads, const float* keys, int64_t count,
                     int64_t dim, int64_t width, float* out, int64_t out_stride);
  // x[0..count) *= 2^shift for an integer shift <= 0, by adding to the exponent bits (AMLA).
  void (*scale_pow2)(float* x, int64_t count, int32_t shift);
  // x[0..count) *= factor: the plain rescale AMLA replaces.
  void (*scale)(float* x, int64_t count, float factor);
};

const LatentOps& GenericLatentOps();
const LatentOps& Avx2LatentOps();
const LatentOps& Avx512LatentOps();

// The matrix work on one tile of keys, for a set of query rows (a row: one head of one token):
// the scores against the tile's keys, and the probability-weighted sum of its rows. Each ISA keeps
// the queries and the tile in the form its loops want. Whatever the rows, a row's results depend
// only on that row and the tile: this is what makes a token's output independent of its batch.
class KeyTileKernel {
 public:
  // Output buffers hold the rows rounded up to a multiple of kRowAlign.
  static constexpr int64_t kRowAlign = 16;

  virtual ~KeyTileKernel() = default;
  // q: [rows, RowLayout::dim] F32, the padded queries already scaled by scale * log2(e).
  virtual void SetQueries(const float* q, int64_t rows) = 0;
  // Keys [first, first + count) of the call `p` become the tile, count <= kKeyBlock (p: where the
  // keys sit in the cache, LatentAttentionParams::CacheRow; a kernel lives across calls).
  virtual void LoadKeys(const float* c_kv, const float* k_pe, const LatentAttentionParams& p, int64_t first,
                        int64_t count) = 0;
  virtual void LoadKeys(const bf16* c_kv, const bf16* k_pe, const LatentAttentionParams& p, int64_t first,
                        int64_t count) = 0;
  // scores [rows, kKeyBlock]: row r against every key of the tile, for rows >= row_begin; the
  // columns past the tile's count are unspecified.
  virtual void Scores(int64_t row_begin, float* scores) = 0;
  // o [rows, RowLayout::lora] += p · tile for rows >= row_begin, where row r of p [rows,
  // kKeyBlock] weighs the tile's first counts[r] keys and is zero past them.
  virtual void Accumulate(const float* p, const int64_t* counts, int64_t row_begin, float* o) = 0;
};

// The variant this CPU runs best, chosen once.
Isa BestLatentIsa();

// The tile kernel of `isa` for up to max_rows query rows. kAmx takes BF16 tiles only (over an F32
// cache it is kAvx512's).
std::unique_ptr<KeyTileKernel> MakeKeyTileKernel(Isa isa, bool bf16_cache, const LatentAttentionParams& p,
                                                 int64_t max_rows);
// The AMX variant (latent_attention_amx.cc): queries and probabilities rounded to BF16, the scores
// and the weighted sums by TDPBF16PS with F32 accumulation.
std::unique_ptr<KeyTileKernel> MakeAmxKeyTileKernel(const LatentAttentionParams& p, int64_t max_rows);

// How LatentAttention splits its work among `threads` threads: 1 runs tasks of a few tokens each
// (their key ranges one after the other); more -- when tokens are fewer than threads and some
// token's keys are cut into several ranges -- one task per (token, range). The result is the same
// bits either way: where a token's keys are cut depends only on how many it sees.
int64_t KeySplits(const LatentAttentionParams& p, int64_t threads);

// kernels::LatentAttention on a given ISA (which must be supported) with a given work split
// (KeySplits; any value > 1 splits over key ranges).
void LatentAttention(Isa isa, int64_t key_splits, const float* q_lat, const float* q_pe, const float* c_kv,
                     const float* k_pe, const LatentAttentionParams& p, float* out);
void LatentAttention(Isa isa, int64_t key_splits, const float* q_lat, const float* q_pe, const bf16* c_kv,
                     const bf16* k_pe, const LatentAttentionParams& p, float* out);

}  // namespace moe::kernels::cpu
