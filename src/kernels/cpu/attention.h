// Internals of the CPU expanded-form Attention kernel, shared by its ISA variants and open to the
// tests, which run every variant the machine supports against kernels/ref.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"

namespace moe::kernels::cpu {

// Keys per tile; tiles start at multiples of kAttentionKeyTile of the keys, whoever asks.
inline constexpr int64_t kAttentionKeyTile = 64;
// Query rows (one head of consecutive tokens) that share the state of one pass over the keys.
inline constexpr int64_t kAttentionQueryBlock = 64;

// One head's keys and values as the tile loops read them.
struct HeadTiles {
  int64_t qk_dim = 0;
  int64_t v_stride = 0;       // v_dim rounded up to 16 floats
  const float* kt = nullptr;  // [tiles][qk_dim][kAttentionKeyTile]: each tile's keys transposed
  const float* v = nullptr;   // [keys][v_stride]
};

// Up to kAttentionQueryBlock consecutive tokens of one head.
struct QueryBlock {
  const float* q = nullptr;  // row r at q + r * q_stride
  int64_t q_stride = 0;
  int64_t rows = 0;
  int64_t first_position = 0;  // row r sees keys 0..first_position + r
  float* out = nullptr;        // row r at out + r * out_stride, v_dim floats
  int64_t out_stride = 0;
  int64_t v_dim = 0;
  float score_scale = 1.0f;  // scale * log2(e): scores in base 2
};

// Floats of scratch AttendBlockAvx512 takes.
int64_t AttendBlockScratch(int64_t v_stride);
void AttendBlockAvx512(const QueryBlock& block, const HeadTiles& head, float* scratch);

// Attention as kernels::Attention runs it, on the variant `isa` (kGeneric or kAvx512).
void Attention(Isa isa, const float* q, const float* k, const float* v, const AttentionParams& p, float* out);

}  // namespace moe::kernels::cpu
