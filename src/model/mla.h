// Multi-head latent attention (MLA) over the latent cache.
#pragma once

#include <cstdint>
#include <span>

#include "model/kv_cache.h"
#include "model/rope.h"
#include "model/weights.h"

namespace moe {

// Expanded: kv_b expands every cached latent into per-head keys and values (cheap for long
// queries). Absorbed: kv_b is folded into the query and the output, so attention runs on the
// latent cache itself (cheap for one query over a long cache). Both give the same result up to
// rounding (the expanded form multiplies BF16 pairs over a BF16 cache).
enum class AttentionForm { kExpanded, kAbsorbed };

// One sequence's rows of a batch: `tokens` consecutive rows at positions start..start+tokens-1,
// whose latents live in the cache blocks listed in block_table (positions [0, start + tokens)).
struct MlaSequence {
  int64_t tokens = 0;
  int64_t start = 0;
  std::span<const int32_t> block_table;
  AttentionForm form = AttentionForm::kExpanded;
};

// x: [rows, hidden], already normalized, the sequences' rows one after the other. The projections
// run on all rows at once; each sequence writes its new latents into its cache slots, rounded to
// the cache's dtype, and attends over its own positions in its own form. Writes the attention
// output (after o_proj) to out: [rows, hidden].
void MlaForward(const AttentionWeights& w, const ModelConfig& config, const Rope& rope, const float* x,
                std::span<const MlaSequence> sequences, LayerKvCache& cache, int64_t block_size, float* out);

// One sequence over a contiguous cache (a single block): rows [start, start + tokens).
void MlaForward(const AttentionWeights& w, const ModelConfig& config, const Rope& rope,
                const float* x, int64_t tokens, int64_t start, LayerKvCache& cache,
                AttentionForm form, float* out);

}  // namespace moe
