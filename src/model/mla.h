// Multi-head latent attention (MLA) over the latent cache.
#pragma once

#include <cstdint>

#include "model/kv_cache.h"
#include "model/rope.h"
#include "model/weights.h"

namespace moe {

// Expanded: kv_b expands every cached latent into per-head keys and values (cheap for long
// queries). Absorbed: kv_b is folded into the query and the output, so attention runs on the
// latent cache itself (cheap for one query over a long cache). Both give the same result.
enum class AttentionForm { kExpanded, kAbsorbed };

// x: [tokens, hidden], already normalized; the tokens sit at positions start..start+tokens-1.
// Writes their latents into cache rows [start, start + tokens) and the attention output
// (after o_proj) to out: [tokens, hidden].
void MlaForward(const AttentionWeights& w, const ModelConfig& config, const Rope& rope,
                const float* x, int64_t tokens, int64_t start, LayerKvCache& cache,
                AttentionForm form, float* out);

}  // namespace moe
