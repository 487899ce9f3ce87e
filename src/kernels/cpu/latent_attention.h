// Internals of the CPU LatentAttention kernel, shared by its ISA variants and open to the tests,
// which run every variant the machine supports against kernels/ref.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace moe::kernels::cpu {

// The inner loops of one key block, per ISA. Rows are padded with zeros to a multiple of
// kLatentLanes floats, so the loops need no tails over the dimension.
inline constexpr int64_t kLatentLanes = 16;

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

enum class Isa { kGeneric, kAvx512 };

// The variant this CPU runs best, chosen once.
Isa BestLatentIsa();
bool IsaSupported(Isa isa);

const LatentOps& GenericLatentOps();
const LatentOps& Avx512LatentOps();

// How LatentAttention splits its work among `threads` threads: 1 runs one task per token (its key
// ranges one after the other); more -- when tokens are fewer than threads and some token's keys
// are cut into several ranges -- one task per (token, range). The result is the same bits either
// way: where a token's keys are cut depends only on how many it sees.
int64_t KeySplits(const LatentAttentionParams& p, int64_t threads);

// kernels::LatentAttention on a given ISA (which must be supported) with a given work split
// (KeySplits; any value > 1 splits over key ranges).
void LatentAttention(Isa isa, int64_t key_splits, const float* q_lat, const float* q_pe, const float* c_kv,
                     const float* k_pe, const LatentAttentionParams& p, float* out);
void LatentAttention(Isa isa, int64_t key_splits, const float* q_lat, const float* q_pe, const bf16* c_kv,
                     const bf16* k_pe, const LatentAttentionParams& p, float* out);

}  // namespace moe::kernels::cpu
