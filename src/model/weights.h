// The weights of a DeepSeek-V3 model, converted at load time to the run precision: linear layers
// in the run dtype (F32, BF16, or I8 with per-output-channel scales), norms, router and
// embeddings in F32.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "model/config.h"

namespace moe {

// A linear layer's [out, in] weight in the run dtype. F32 and BF16 weights are held as they are;
// I8 weights (one F32 scale per row) only in the layouts the kernels read: Int8Gemv's, and oneDNN's
// where AMX-INT8 does not run the shape (kernels::NeedsMatmulPacking); the plain one is one more
// copy that only an lm_head's greedy rows read (kernels::MatmulTwoPart).
struct Linear {
  DType dtype = DType::kF32;
  int64_t out = 0, in = 0;
  Tensor weight;       // F32 or BF16; for I8 the plain rows in heads (MakeHead), empty elsewhere
  Tensor row_scales;   // [out], F32; I8 only
  Tensor packed;       // I8 only: as kernels::PackMatmulWeight lays it out, where NeedsMatmulPacking
  Tensor gemv_packed;  // I8 only: as kernels::PackGemvWeight lays it out (empty where unsupported)
  Tensor row_norms;    // I8 heads only: kernels::I8RowNorms, for greedy rows' logits

  int64_t rows() const { return out; }
  kernels::Weight view() const {
    return kernels::Weight(TensorView{const_cast<void*>(weight.raw()), dtype, {out, in}},
                           row_scales.empty() ? nullptr : row_scales.data<float>(),
                           packed.empty() ? nullptr : packed.data<int8_t>(),
                           gemv_packed.empty() ? nullptr : gemv_packed.data<int8_t>());
  }
};

// Converts an F32 [out, in] weight to `dtype`: kF32, kBF16 or kI8 (symmetric, per row).
Linear MakeLinear(Tensor f32_weight, DType dtype);
// The same for an lm_head: an I8 one keeps its plain rows and their norms, for greedy rows.
Linear MakeHead(Tensor f32_weight, DType dtype);

struct AttentionWeights {
  // The projections of x: q_a (with q_lora_rank) or q_proj (without), then kv_a, stacked as one
  // weight, so that one GEMM reads both and x is quantized once (MakeInputProjection).
  Linear q_kv_a;
  Linear q_b;  // with q_lora_rank
  Tensor q_a_norm, kv_a_norm;
  Linear kv_b, o_proj;
  // kv_b split per head for the absorbed form: k_absorb[h] = W_uk[h]^T as [kv_lora, nope] and
  // v_absorb[h] = W_uv[h] as [v, kv_lora], both in the `y = x · w^T` layout Matmul takes.
  std::vector<Linear> k_absorb, v_absorb;
};

struct MlpWeights {  // SwiGLU: down(silu(gate(x)) * up(x))
  Linear gate, up, down;
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
  Tensor embed, enorm, hnorm, head_norm;
  Linear eh_proj, head;
  LayerWeights block;
};

struct ModelWeights {
  Tensor embed;  // [vocab, hidden], F32
  std::vector<LayerWeights> layers;
  Tensor final_norm;
  Linear lm_head;
  std::optional<MtpWeights> mtp;
};

// AttentionWeights::q_kv_a from F32 [q rows, hidden] (q_a or q_proj) and [kv_lora + rope, hidden]
// (kv_a), in `dtype`.
Linear MakeInputProjection(const Tensor& q_f32, const Tensor& kv_a_f32, DType dtype);

// Fills k_absorb and v_absorb, in `dtype`, from kv_b given in F32.
void SplitAbsorbedWeights(const ModelConfig& config, const Tensor& kv_b_f32, DType dtype,
                          AttentionWeights& attention);

// The experts of every MoE layer this process runs (the others run on other ranks); by default all.
struct ExpertSelection {
  std::function<bool(int64_t e)> routed;  // whether routed expert e is here; empty: every one
  bool shared = true;
};

// `dtype` is the run precision of linear layers: kF32, kBF16 or kI8. Experts left out of
// `experts` stay empty.
Expected<ModelWeights> LoadModelWeights(const Checkpoint& checkpoint, const ModelConfig& config,
                                        DType dtype, const ExpertSelection& experts = {});

}  // namespace moe
