// The expanded and absorbed forms of MLA are the same function: check it on random weights, for
// a prefill followed by decode steps, with and without q_lora.
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "model/mla.h"

namespace moe {
namespace {

Tensor RandomTensor(Shape shape, std::mt19937& rng, float scale) {
  Tensor t = Tensor::F32(std::move(shape));
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

ModelConfig SmallConfig(bool q_lora) {
  ModelConfig c;
  c.hidden_size = 48;
  c.num_attention_heads = 3;
  if (q_lora) c.q_lora_rank = 24;
  c.kv_lora_rank = 20;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 12;
  c.max_position_embeddings = 64;
  c.yarn = YarnScaling{.factor = 4.0, .original_max_position_embeddings = 16, .mscale = 1.0, .mscale_all_dim = 1.0};
  return c;
}

AttentionWeights RandomAttention(const ModelConfig& c, DType dtype, std::mt19937& rng) {
  auto linear = [&](Shape shape, float scale) { return MakeLinear(RandomTensor(std::move(shape), rng, scale), dtype); };
  const int64_t heads = c.num_attention_heads, hidden = c.hidden_size;
  AttentionWeights a;
  if (c.q_lora_rank) {
    a.q_a = linear({*c.q_lora_rank, hidden}, 0.15f);
    a.q_a_norm = RandomTensor({*c.q_lora_rank}, rng, 1.0f);
    a.q_b = linear({heads * c.qk_head_dim(), *c.q_lora_rank}, 0.2f);
  } else {
    a.q_proj = linear({heads * c.qk_head_dim(), hidden}, 0.15f);
  }
  a.kv_a = linear({c.kv_lora_rank + c.qk_rope_head_dim, hidden}, 0.15f);
  a.kv_a_norm = RandomTensor({c.kv_lora_rank}, rng, 1.0f);
  Tensor kv_b = RandomTensor({heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, rng, 0.2f);
  a.o_proj = linear({hidden, heads * c.v_head_dim}, 0.15f);
  SplitAbsorbedWeights(c, kv_b, dtype, a);
  a.kv_b = MakeLinear(std::move(kv_b), dtype);
  return a;
}

class MlaFormsTest : public testing::TestWithParam<bool> {};

TEST_P(MlaFormsTest, ExpandedAndAbsorbedAgree) {
  const ModelConfig c = SmallConfig(GetParam());
  std::mt19937 rng(42);
  const AttentionWeights w = RandomAttention(c, DType::kF32, rng);
  const Rope rope = BuildRope(c);
  const int64_t prompt = 7, steps = 4, total = prompt + steps, hidden = c.hidden_size;
  const Tensor x = RandomTensor({total, hidden}, rng, 1.0f);

  std::vector<float> out[2];
  const AttentionForm forms[2] = {AttentionForm::kExpanded, AttentionForm::kAbsorbed};
  for (int f = 0; f < 2; ++f) {
    SequenceKvCache cache(c, 1, total);
    out[f].resize(total * hidden);
    // The prompt in one call, then one token per call, as prefill and decode do.
    MlaForward(w, c, rope, x.data<float>(), prompt, 0, cache.layers[0], forms[f], out[f].data());
    for (int64_t t = prompt; t < total; ++t) {
      MlaForward(w, c, rope, x.data<float>() + t * hidden, 1, t, cache.layers[0], forms[f], out[f].data() + t * hidden);
    }
  }
  for (int64_t i = 0; i < total * hidden; ++i) {
    ASSERT_NEAR(out[0][i], out[1][i], 1e-4f * (1.0f + std::fabs(out[0][i]))) << "at " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(QLora, MlaFormsTest, testing::Bool());

}  // namespace
}  // namespace moe
