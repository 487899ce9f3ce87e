// Internals of the CPU expanded-form Attention kernel, shared by its ISA variants and open to the
// tests, which run every variant the machine supports against kernels/ref.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"

namespace moe::kernels::cpu {

// Keys per tile; tiles start at multiples of kAttentionKeyTile of the keys, whoever asks.
inline constexpr int64_t kAttentionKeyTile = 64;
// Query rows (one head of consecutive tokens) that share the state of one pass over the keys.
inline constexpr int64_t kAttentionQueryBlock = 64;

// BF16 pairs per key in HeadTiles::kt_pairs: ceil(qk_dim / 2), padded with zeros to a multiple of
// 16, an AMX tile's step of k.
inline int64_t KeyPairs(int64_t qk_dim) { return (qk_dim + 31) / 32 * 16; }

// One head's keys and values as the tile loops read them: F32, or for BF16 products rounded to
// BF16 in pairs along the dimension the products sum over, as vdpbf16ps takes them.
struct HeadTiles {
  int64_t qk_dim = 0;
  int64_t v_stride = 0;             // v_dim rounded up to 16 floats
  const float* kt = nullptr;        // [tiles][qk_dim][kAttentionKeyTile]: each tile's keys transposed
  const float* v = nullptr;         // [keys][v_stride]
  const bf16* kt_pairs = nullptr;   // [tiles][KeyPairs(qk_dim)][kAttentionKeyTile][2], zero-padded
  const bf16* v_pairs = nullptr;    // [tiles * kAttentionKeyTile / 2][v_stride][2], zero-padded
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

// Floats of scratch the block loops take: the AVX-512 ones, the AMX one, and the AVX2 one.
int64_t AttendBlockScratch(int64_t qk_dim, int64_t v_stride);
int64_t AttendBlockAmxScratch(int64_t qk_dim, int64_t v_stride);
int64_t AttendBlockAvx2Scratch(int64_t v_stride);
// The block against the head's F32 tiles (AVX-512, or AVX2 and FMA), or (Bf16, Amx) its BF16 pairs.
void AttendBlockAvx512(const QueryBlock& block, const HeadTiles& head, float* scratch);
void AttendBlockAvx2(const QueryBlock& block, const HeadTiles& head, float* scratch);
void AttendBlockAvx512Bf16(const QueryBlock& block, const HeadTiles& head, float* scratch);
void AttendBlockAmx(const QueryBlock& block, const HeadTiles& head, float* scratch);

// Head h's keys [0, p.keys) and values as HeadTiles::kt_pairs and v_pairs lay them out.
void LayOutHeadPairsAvx512Bf16(const float* k, const float* v, const AttentionParams& p, int64_t h, int64_t v_stride,
                               bf16* kt, bf16* vt);

// x[0..n) rounded to BF16 (to nearest even), as ceil(n / 2) pairs, x[2i] in the low half of pair i,
// the last one zero-padded. Needs AVX512-BF16.
void RoundToPairs(const float* x, int64_t n, uint32_t* pairs);

// Whether `isa` runs p with BF16 products: p asks for them and the CPU has AVX512-BF16 (kAvx512:
// VDPBF16PS; kAmx: tiles, which take the same rounded operands).
bool UsesBf16Products(Isa isa, const AttentionParams& p);

// Attention as kernels::Attention runs it, on the variant `isa` (kGeneric, kAvx2, which runs F32
// products only, kAvx512, or kAmx, which runs F32 products as kAvx512 does).
void Attention(Isa isa, const float* q, const float* k, const float* v, const AttentionParams& p, float* out);

}  // namespace moe::kernels::cpu
