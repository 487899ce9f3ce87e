// Attention on the CPU: causal multi-head attention in the expanded form, for prompt tokens
// (decode tokens take the absorbed form, latent_attention.cc).
//
// Flash-attention layout. A task is one head of up to kAttentionQueryBlock consecutive tokens; it
// walks that head's keys once, in tiles of kAttentionKeyTile keys, keeping each row's online-
// softmax state (running max m, sum l, output O) across tiles, so a tile is read from cache once
// per block of rows instead of once per row. Before its first task on a head, a thread lays the
// head's keys out transposed per tile and its values padded (HeadTiles), the form the AVX-512 loops
// read without gathers (for BF16 products: rounded to BF16, in the pairs VDPBF16PS multiplies,
// which are also the B operands of the AMX loops, attention_amx.cc).
// Tasks run head-major, so the threads split the heads and a thread lays out each head once.
//
// Online softmax in base 2, as in latent_attention.cc: scores are scaled by scale * log2(e), and
// when a tile raises a row's max from m to m', l and O are multiplied by 2^(m - m').
//
// Independence from the batch: a row's arithmetic depends only on its query, its position and the
// keys (tiles start at multiples of kAttentionKeyTile of the keys, and a row's keys past its
// position weigh exactly zero), never on which other rows share its block or its thread. So a
// prompt token's output is the same bits whether the prompt comes whole or in chunks, which is
// what lets the engine run prompt tokens in this form and keep its outputs batch-invariant.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <vector>

#include "base/check.h"
#include "base/cpu_features.h"
#include "base/int_math.h"
#include "base/thread_pool.h"

namespace moe::kernels::cpu {
namespace {

// One (token, head) pair at a time: scores, softmax, then the probability-weighted sum of values.
void AttentionGeneric(const float* q, const float* k, const float* v, const AttentionParams& p, float* out) {
  ParallelFor(p.tokens * p.heads, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(p.keys);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / p.heads, h = task % p.heads;
      const int64_t visible = p.q_offset + t + 1;
      const float* qv = q + task * p.qk_dim;
      float max = -INFINITY;
      for (int64_t s = 0; s < visible; ++s) {
        const float* kv = k + (s * p.heads + h) * p.qk_dim;
        float dot = 0;
        for (int64_t i = 0; i < p.qk_dim; ++i) dot += qv[i] * kv[i];
        scores[s] = dot * p.scale;
        max = std::max(max, scores[s]);
      }
      float sum = 0;
      for (int64_t s = 0; s < visible; ++s) sum += (scores[s] = std::exp(scores[s] - max));
      float* o = out + task * p.v_dim;
      std::fill(o, o + p.v_dim, 0.0f);
      for (int64_t s = 0; s < visible; ++s) {
        const float* row = v + (s * p.heads + h) * p.v_dim;
        const float weight = scores[s] / sum;
        for (int64_t i = 0; i < p.v_dim; ++i) o[i] += weight * row[i];
      }
    }
  });
}

// Head h's keys [0, keys) transposed per tile and its values padded, in F32 (see HeadTiles).
void LayOutHead(const float* k, const float* v, const AttentionParams& p, int64_t h, int64_t v_stride, float* kt,
                float* vt) {
  auto column = [&](int64_t s) { return kt + s / kAttentionKeyTile * p.qk_dim * kAttentionKeyTile + s % kAttentionKeyTile; };
  for (int64_t s = 0; s < p.keys; ++s) {
    const float* key = k + (s * p.heads + h) * p.qk_dim;
    float* to = column(s);
    for (int64_t d = 0; d < p.qk_dim; ++d) to[d * kAttentionKeyTile] = key[d];
    float* value = vt + s * v_stride;
    std::copy_n(v + (s * p.heads + h) * p.v_dim, p.v_dim, value);
    std::fill(value + p.v_dim, value + v_stride, 0.0f);
  }
  for (int64_t s = p.keys; s < RoundUp(p.keys, kAttentionKeyTile); ++s) {
    float* to = column(s);
    for (int64_t d = 0; d < p.qk_dim; ++d) to[d * kAttentionKeyTile] = 0.0f;
  }
}

// The tile loops of `isa` (kAvx2, kAvx512 or kAmx) over every head and block of query rows.
void AttentionTiles(Isa isa, const float* q, const float* k, const float* v, const AttentionParams& p, float* out) {
  const int64_t blocks = CeilDiv(p.tokens, kAttentionQueryBlock);
  const int64_t v_stride = RoundUp(p.v_dim, 16);
  const int64_t padded_keys = RoundUp(p.keys, kAttentionKeyTile);
  const float score_scale = p.scale * std::numbers::log2e_v<float>;
  const bool bf16_products = UsesBf16Products(isa, p);
  const bool amx = bf16_products && isa == Isa::kAmx;
  const bool avx2 = isa == Isa::kAvx2;
  void (*const attend)(const QueryBlock&, const HeadTiles&, float*) =
      amx ? AttendBlockAmx : bf16_products ? AttendBlockAvx512Bf16 : avx2 ? AttendBlockAvx2 : AttendBlockAvx512;
  ParallelFor(p.heads * blocks, [&](int64_t begin, int64_t end) {
    std::unique_ptr<float[]> kt, vt;
    std::unique_ptr<bf16[]> kt_pairs, v_pairs;
    HeadTiles tiles{.qk_dim = p.qk_dim, .v_stride = v_stride};
    if (bf16_products) {
      kt_pairs = std::make_unique_for_overwrite<bf16[]>(padded_keys * KeyPairs(p.qk_dim) * 2);
      v_pairs = std::make_unique_for_overwrite<bf16[]>(padded_keys * v_stride);
      tiles.kt_pairs = kt_pairs.get();
      tiles.v_pairs = v_pairs.get();
    } else {
      kt = std::make_unique_for_overwrite<float[]>(padded_keys * p.qk_dim);
      vt = std::make_unique_for_overwrite<float[]>(p.keys * v_stride);
      tiles.kt = kt.get();
      tiles.v = vt.get();
    }
    const auto scratch = std::make_unique_for_overwrite<float[]>(
        amx    ? AttendBlockAmxScratch(p.qk_dim, v_stride)
        : avx2 ? AttendBlockAvx2Scratch(v_stride)
               : AttendBlockScratch(p.qk_dim, v_stride));
    int64_t laid_out = -1;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / blocks, first = task % blocks * kAttentionQueryBlock;
      if (h != laid_out) {
        if (bf16_products) {
          LayOutHeadPairsAvx512Bf16(k, v, p, h, v_stride, kt_pairs.get(), v_pairs.get());
        } else {
          LayOutHead(k, v, p, h, v_stride, kt.get(), vt.get());
        }
        laid_out = h;
      }
      const QueryBlock block{.q = q + (first * p.heads + h) * p.qk_dim,
                             .q_stride = p.heads * p.qk_dim,
                             .rows = std::min(kAttentionQueryBlock, p.tokens - first),
                             .first_position = p.q_offset + first,
                             .out = out + (first * p.heads + h) * p.v_dim,
                             .out_stride = p.heads * p.v_dim,
                             .v_dim = p.v_dim,
                             .score_scale = score_scale};
      attend(block, tiles, scratch.get());
    }
  });
}

}  // namespace

bool UsesBf16Products(Isa isa, const AttentionParams& p) {
  return p.bf16_products && (isa == Isa::kAvx512 || isa == Isa::kAmx) && GetCpuFeatures().avx512bf16;
}

void Attention(Isa isa, const float* q, const float* k, const float* v, const AttentionParams& p, float* out) {
  MOE_CHECK(IsaSupported(isa), "Attention: this CPU cannot run the requested ISA");
  if (isa == Isa::kGeneric) {
    AttentionGeneric(q, k, v, p, out);
  } else {
    AttentionTiles(isa, q, k, v, p, out);
  }
}

}  // namespace moe::kernels::cpu

namespace moe::kernels {

void Attention(const float* q, const float* k, const float* v, const AttentionParams& p, float* out) {
  static const cpu::Isa isa = cpu::IsaSupported(cpu::Isa::kAmx)      ? cpu::Isa::kAmx
                              : cpu::IsaSupported(cpu::Isa::kAvx512) ? cpu::Isa::kAvx512
                              : cpu::IsaSupported(cpu::Isa::kAvx2)   ? cpu::Isa::kAvx2
                                                                     : cpu::Isa::kGeneric;
  cpu::Attention(isa, q, k, v, p, out);
}

}  // namespace moe::kernels
