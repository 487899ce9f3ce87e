// The expanded and absorbed forms of MLA are the same function: check it on random weights, for
// a prefill followed by decode steps, with and without q_lora, over an F32 and a BF16 cache.
#include <cmath>
#include <random>
#include <string>
#include <tuple>
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
  const Tensor q = RandomTensor({c.q_lora_rank ? *c.q_lora_rank : heads * c.qk_head_dim(), hidden}, rng, 0.15f);
  if (c.q_lora_rank) {
    a.q_a_norm = RandomTensor({*c.q_lora_rank}, rng, 1.0f);
    a.q_b = linear({heads * c.qk_head_dim(), *c.q_lora_rank}, 0.2f);
  }
  a.q_kv_a = MakeInputProjection(q, RandomTensor({c.kv_lora_rank + c.qk_rope_head_dim, hidden}, rng, 0.15f), dtype);
  a.kv_a_norm = RandomTensor({c.kv_lora_rank}, rng, 1.0f);
  Tensor kv_b = RandomTensor({heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, rng, 0.2f);
  a.o_proj = linear({hidden, heads * c.v_head_dim}, 0.15f);
  SplitAbsorbedWeights(c, kv_b, dtype, a);
  a.kv_b = MakeLinear(std::move(kv_b), dtype);
  return a;
}

// The prompt in one call, then one token per call, as prefill and decode do; returns the outputs
// of all positions.
std::vector<float> RunSequence(const AttentionWeights& w, const ModelConfig& c, const Tensor& x, int64_t prompt,
                               DType cache_dtype, AttentionForm form) {
  const Rope rope = BuildRope(c);
  const int64_t total = x.dim(0), hidden = c.hidden_size;
  SequenceKvCache cache(c, 1, total, cache_dtype);
  std::vector<float> out(total * hidden);
  MlaForward(w, c, rope, x.data<float>(), prompt, 0, cache.layers[0], form, out.data());
  for (int64_t t = prompt; t < total; ++t) {
    MlaForward(w, c, rope, x.data<float>() + t * hidden, 1, t, cache.layers[0], form, out.data() + t * hidden);
  }
  return out;
}

class MlaFormsTest : public testing::TestWithParam<std::tuple<bool, DType>> {};

TEST_P(MlaFormsTest, ExpandedAndAbsorbedAgree) {
  const auto [q_lora, cache_dtype] = GetParam();
  const ModelConfig c = SmallConfig(q_lora);
  std::mt19937 rng(42);
  const AttentionWeights w = RandomAttention(c, DType::kF32, rng);
  const int64_t prompt = 7, total = prompt + 4;
  const Tensor x = RandomTensor({total, c.hidden_size}, rng, 1.0f);

  const std::vector<float> expanded = RunSequence(w, c, x, prompt, cache_dtype, AttentionForm::kExpanded);
  const std::vector<float> absorbed = RunSequence(w, c, x, prompt, cache_dtype, AttentionForm::kAbsorbed);
  if (cache_dtype == DType::kF32) {
    // F32 products in both forms over the same cached values.
    for (size_t i = 0; i < expanded.size(); ++i) {
      ASSERT_NEAR(expanded[i], absorbed[i], 1e-4f * (1.0f + std::fabs(expanded[i]))) << "at " << i;
    }
    return;
  }
  // Over a BF16 cache the expanded form multiplies BF16-rounded queries, keys, probabilities and
  // values (the absorbed form F32 ones): each off by up to 2^-9 of itself, the output by a few
  // times that of its scale.
  float scale = 0, max_diff = 0;
  for (size_t i = 0; i < expanded.size(); ++i) {
    scale = std::max(scale, std::fabs(absorbed[i]));
    max_diff = std::max(max_diff, std::fabs(expanded[i] - absorbed[i]));
  }
  EXPECT_LT(max_diff, scale / 64) << "largest output " << scale;
}

INSTANTIATE_TEST_SUITE_P(QLoraAndCache, MlaFormsTest,
                         testing::Combine(testing::Bool(), testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "QLora_" : "QProj_") +
                                  std::string(DTypeName(std::get<1>(info.param))) + "Cache";
                         });

TEST(MlaCacheTest, Bf16CacheStaysCloseToF32) {
  const ModelConfig c = SmallConfig(true);
  std::mt19937 rng(7);
  const AttentionWeights w = RandomAttention(c, DType::kF32, rng);
  const int64_t prompt = 7, total = prompt + 4;
  const Tensor x = RandomTensor({total, c.hidden_size}, rng, 1.0f);
  for (AttentionForm form : {AttentionForm::kExpanded, AttentionForm::kAbsorbed}) {
    const std::vector<float> f32 = RunSequence(w, c, x, prompt, DType::kF32, form);
    const std::vector<float> bf16 = RunSequence(w, c, x, prompt, DType::kBF16, form);
    // BF16 keeps 8 significant bits: each cached value is off by up to 2^-9 of itself, and the
    // output, a few layers of sums of such values, by a few times that at most.
    float scale = 0, max_diff = 0;
    for (size_t i = 0; i < f32.size(); ++i) {
      scale = std::max(scale, std::fabs(f32[i]));
      max_diff = std::max(max_diff, std::fabs(f32[i] - bf16[i]));
    }
    EXPECT_LT(max_diff, 2e-2f * scale);
    EXPECT_GT(max_diff, 0.0f);  // the cache really was rounded
  }
}

}  // namespace
}  // namespace moe
