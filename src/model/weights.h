// The weights of a DeepSeek-V3 model, converted at load time to the run precision: linear layers
// in the run dtype (F32 or BF16), norms, router and embeddings in F32.
#pragma once

#include <optional>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"

namespace moe {

struct AttentionWeights {
  Tensor q_a, q_a_norm, q_b;  // with q_lora_rank
  Tensor q_proj;              // without
  Tensor kv_a, kv_a_norm, kv_b, o_proj;
  // kv_b split per head for the absorbed form: k_absorb[h] = W_uk[h]^T as [kv_lora, nope] and
  // v_absorb[h] = W_uv[h] as [v, kv_lora], both in the `y = x · w^T` layout Matmul takes.
  std::vector<Tensor> k_absorb, v_absorb;
};

struct MlpWeights {  // SwiGLU: down(silu(gate(x)) * up(x))
  Tensor gate, up, down;
};

struct MoeWeights {
  Tensor router;      // [n_routed_experts, hidden], F32
  Tensor score_bias;  // e_score_correction_bias, F32; empty unless noaux_tc
  std::vector<MlpWeights> experts;
  std::optional<MlpWeights> shared;  // all shared experts as one wide MLP
};

struct LayerWeights {
  Tensor input_norm, post_attention_norm;
  AttentionWeights attention;
  std::optional<MlpWeights> dense;  // exactly one of dense and moe is set
  std::optional<MoeWeights> moe;
};

struct MtpWeights {
  Tensor embed, enorm, hnorm, eh_proj, head_norm, head;
  LayerWeights block;
};

struct ModelWeights {
  Tensor embed;  // [vocab, hidden], F32
  std::vector<LayerWeights> layers;
  Tensor final_norm, lm_head;
  std::optional<MtpWeights> mtp;
};

// Fills k_absorb and v_absorb from kv_b.
void SplitAbsorbedWeights(const ModelConfig& config, AttentionWeights& attention);

// `dtype` is the run precision of linear layers: kF32 or kBF16.
Expected<ModelWeights> LoadModelWeights(const Checkpoint& checkpoint, const ModelConfig& config,
                                        DType dtype);

}  // namespace moe
