// ModelConfig: the fields of a Hugging Face config.json of model_type deepseek_v3 / deepseek_v2
// that the forward pass uses, validated once at load time.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"

namespace moe {

enum class ScoringFunc { kSigmoid, kSoftmax };
// noaux_tc: DeepSeek-V3 (group score = sum of the two best biased scores);
// group_limited_greedy: DeepSeek-V2 (group score = best score); greedy: plain top-k.
enum class TopkMethod { kNoauxTc, kGroupLimitedGreedy, kGreedy };

struct YarnScaling {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct ModelConfig {
  std::string model_type;  // "deepseek_v3" or "deepseek_v2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP width
  int64_t moe_intermediate_size = 0;  // width of one routed or shared expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t n_routed_experts = 0;  // 0: every layer dense
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  TopkMethod topk_method = TopkMethod::kNoauxTc;
  ScoringFunc scoring_func = ScoringFunc::kSigmoid;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  std::optional<int64_t> q_lora_rank;  // null: plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  std::optional<YarnScaling> yarn;  // rope_scaling with type "yarn"
  double rms_norm_eps = 1e-6;
  int64_t num_nextn_predict_layers = 0;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Whether decoder layer `layer` (the MTP layer included) has an MoE block.
  bool IsMoeLayer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // The attention softmax scale, with YaRN's mscale^2 when the YaRN factor > 1.
  double SoftmaxScale() const;
};

// Parses and validates config.json text; `source` names the file in error messages.
Expected<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);
Expected<ModelConfig> LoadModelConfig(const std::string& path);

}  // namespace moe
