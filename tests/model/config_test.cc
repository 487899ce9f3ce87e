#include "model/config.h"

#include <cmath>

#include <gtest/gtest.h>

#include "test_files.h"

namespace moe {
namespace {

using nlohmann::json;
using test::ExpectError;

constexpr const char* kSource = "models/tiny/config.json";

// A small but complete deepseek_v3 config in the shape of the official release.
json V3() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 1024,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_group": 4,
    "topk_group": 2,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": true,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "q_lora_rank": 96,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "max_position_embeddings": 4096,
    "rope_theta": 10000,
    "rope_scaling": {
      "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0
    },
    "rms_norm_eps": 1e-06,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": false,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16"
  })");
}

// DeepSeek-V2-Lite's config.json, verbatim in the fields we read.
json V2Lite() {
  return json::parse(R"({
    "model_type": "deepseek_v2",
    "vocab_size": 102400,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "n_shared_experts": 2,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "greedy",
    "norm_topk_prob": false,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "q_lora_rank": null,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {
      "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
      "original_max_position_embeddings": 4096, "type": "yarn"
    },
    "rms_norm_eps": 1e-06,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "tie_word_embeddings": false
  })");
}

Expected<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump(), kSource); }

// Expects the config to be rejected with a message naming the file, `field` and `what`.
void ExpectRejected(const json& j, const std::string& field, const std::string& what) {
  ExpectError(Parse(j), {kSource, field, what});
}

TEST(ConfigTest, ParsesV3) {
  auto c = Parse(V3());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model_type, "deepseek_v3");
  EXPECT_EQ(c->vocab_size, 1024);
  EXPECT_EQ(c->hidden_size, 256);
  EXPECT_EQ(c->intermediate_size, 512);
  EXPECT_EQ(c->moe_intermediate_size, 64);
  EXPECT_EQ(c->num_hidden_layers, 4);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->n_shared_experts, 1);
  EXPECT_EQ(c->n_routed_experts, 16);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->n_group, 4);
  EXPECT_EQ(c->topk_group, 2);
  EXPECT_EQ(c->topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSigmoid);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_EQ(c->first_k_dense_replace, 1);
  EXPECT_EQ(c->q_lora_rank, 96);
  EXPECT_EQ(c->kv_lora_rank, 64);
  EXPECT_EQ(c->qk_head_dim(), 48);
  EXPECT_EQ(c->v_head_dim, 32);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  EXPECT_EQ(c->bos_token_id, 0);
  EXPECT_EQ(c->eos_token_id, 1);
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_TRUE(c->IsMoeLayer(1));
  EXPECT_TRUE(c->IsMoeLayer(4));  // the MTP layer
}

TEST(ConfigTest, ParsesV2Lite) {
  auto c = Parse(V2Lite());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model_type, "deepseek_v2");
  EXPECT_EQ(c->topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSoftmax);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_FALSE(c->q_lora_rank.has_value());
  EXPECT_EQ(c->n_routed_experts, 64);
  EXPECT_EQ(c->num_experts_per_tok, 6);
  EXPECT_EQ(c->num_nextn_predict_layers, 0);
  ASSERT_TRUE(c->yarn.has_value());
  EXPECT_EQ(c->yarn->factor, 40.0);
  EXPECT_EQ(c->yarn->mscale_all_dim, 0.707);
  EXPECT_EQ(c->eos_token_id, 100001);
}

TEST(ConfigTest, RoutingDefaultsDependOnModelType) {
  json v3 = V3();
  v3.erase("topk_method");
  v3.erase("scoring_func");
  auto c3 = Parse(v3);
  ASSERT_TRUE(c3.ok()) << c3.status().message();
  EXPECT_EQ(c3->topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c3->scoring_func, ScoringFunc::kSigmoid);

  json v2 = V2Lite();
  v2.erase("topk_method");
  v2.erase("scoring_func");
  auto c2 = Parse(v2);
  ASSERT_TRUE(c2.ok()) << c2.status().message();
  EXPECT_EQ(c2->topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(c2->scoring_func, ScoringFunc::kSoftmax);

  v2["topk_method"] = "group_limited_greedy";
  auto grouped = Parse(v2);
  ASSERT_TRUE(grouped.ok()) << grouped.status().message();
  EXPECT_EQ(grouped->topk_method, TopkMethod::kGroupLimitedGreedy);
}

TEST(ConfigTest, OptionalFieldsTakeDefaults) {
  json j = V3();
  for (const char* key :
       {"n_shared_experts", "n_group", "topk_group", "first_k_dense_replace", "moe_layer_freq",
        "num_nextn_predict_layers", "norm_topk_prob", "routed_scaling_factor", "rope_theta", "rope_scaling",
        "bos_token_id", "eos_token_id", "q_lora_rank", "tie_word_embeddings"}) {
    j.erase(key);
  }
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->n_shared_experts, 0);
  EXPECT_EQ(c->n_group, 1);
  EXPECT_EQ(c->topk_group, 1);
  EXPECT_EQ(c->first_k_dense_replace, 0);
  EXPECT_EQ(c->moe_layer_freq, 1);
  EXPECT_EQ(c->num_nextn_predict_layers, 0);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->routed_scaling_factor, 1.0);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->yarn.has_value());
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_FALSE(c->eos_token_id.has_value());
  EXPECT_FALSE(c->q_lora_rank.has_value());
  EXPECT_FALSE(c->tie_word_embeddings);
}

TEST(ConfigTest, DenseModelNeedsNoMoeFields) {
  json j = V3();
  j["n_routed_experts"] = nullptr;
  j.erase("moe_intermediate_size");
  j.erase("num_experts_per_tok");
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->n_routed_experts, 0);
  EXPECT_FALSE(c->IsMoeLayer(2));
}

TEST(ConfigTest, EosTokenListTakesFirst) {
  json j = V3();
  j["eos_token_id"] = {7, 8};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->eos_token_id, 7);
  j["eos_token_id"] = json::array();
  ExpectRejected(j, "eos_token_id", "non-empty list");
}

TEST(ConfigTest, YarnWithRopeTypeKeyAndDefaults) {
  json j = V3();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE(c->yarn.has_value());
  const YarnScaling defaults;
  EXPECT_EQ(c->yarn->factor, 4.0);
  EXPECT_EQ(c->yarn->original_max_position_embeddings, defaults.original_max_position_embeddings);
  EXPECT_EQ(c->yarn->beta_fast, defaults.beta_fast);
  EXPECT_EQ(c->yarn->beta_slow, defaults.beta_slow);
  EXPECT_EQ(c->yarn->mscale, defaults.mscale);
  EXPECT_EQ(c->yarn->mscale_all_dim, 0.0);
}

TEST(ConfigTest, SoftmaxScale) {
  json j = V3();
  j["rope_scaling"] = nullptr;
  auto plain = Parse(j);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_DOUBLE_EQ(plain->SoftmaxScale(), 1.0 / std::sqrt(48.0));

  // mscale = 0.1 * 1.0 * ln(40) + 1 = 1.36888794541139...
  auto yarn = Parse(V3());
  ASSERT_TRUE(yarn.ok()) << yarn.status().message();
  EXPECT_NEAR(yarn->SoftmaxScale(), 1.3688879454113936 * 1.3688879454113936 / std::sqrt(48.0), 1e-12);

  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 1.0}, {"mscale_all_dim", 1.0}};
  auto unit = Parse(j);
  ASSERT_TRUE(unit.ok()) << unit.status().message();
  EXPECT_DOUBLE_EQ(unit->SoftmaxScale(), 1.0 / std::sqrt(48.0));
}

TEST(ConfigTest, LoadsFromFile) {
  test::TempDir dir;
  const std::string path = dir.Write("config.json", V3().dump());
  auto c = LoadModelConfig(path);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->hidden_size, 256);
}

TEST(ConfigTest, MissingFile) {
  test::TempDir dir;
  ExpectError(LoadModelConfig(dir.path() + "/config.json"), {dir.path() + "/config.json", "cannot open"});
}

TEST(ConfigTest, InvalidJson) {
  ExpectError(ParseModelConfig(R"({"model_type": "deepseek_v3",)", kSource), {kSource, "invalid JSON"});
  ExpectError(ParseModelConfig("[]", kSource), {kSource, "JSON object"});
}

TEST(ConfigTest, UnsupportedModelType) {
  json j = V3();
  j["model_type"] = "llama";
  ExpectRejected(j, "model_type", "'llama'");
  j.erase("model_type");
  ExpectRejected(j, "model_type", "missing");
}

TEST(ConfigTest, MissingRequiredField) {
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "max_position_embeddings",
        "rms_norm_eps", "moe_intermediate_size", "num_experts_per_tok"}) {
    json j = V3();
    j.erase(key);
    ExpectRejected(j, key, "is required but missing");
  }
}

TEST(ConfigTest, WrongType) {
  json j = V3();
  j["hidden_size"] = "7168";
  ExpectRejected(j, "hidden_size", "must be an integer, got string");
  j = V3();
  j["hidden_size"] = 7168.5;
  ExpectRejected(j, "hidden_size", "must be an integer, got number");
  j = V3();
  j["rms_norm_eps"] = "1e-6";
  ExpectRejected(j, "rms_norm_eps", "must be a number, got string");
  j = V3();
  j["norm_topk_prob"] = 1;
  ExpectRejected(j, "norm_topk_prob", "must be a boolean");
  j = V3();
  j["topk_method"] = 3;
  ExpectRejected(j, "topk_method", "must be a string");
  j = V3();
  j["rope_scaling"]["factor"] = "40";
  ExpectRejected(j, "rope_scaling.factor", "must be a number, got string");
  j = V3();
  j["rope_scaling"] = 40;
  ExpectRejected(j, "rope_scaling", "must be an object or null");
}

TEST(ConfigTest, NonPositiveSize) {
  json j = V3();
  j["num_attention_heads"] = 0;
  ExpectRejected(j, "num_attention_heads = 0", "> 0");
  j = V3();
  j["vocab_size"] = -5;
  ExpectRejected(j, "vocab_size = -5", "> 0");
  j = V3();
  j["q_lora_rank"] = 0;
  ExpectRejected(j, "q_lora_rank = 0", "> 0");
}

TEST(ConfigTest, TopkAboveExperts) {
  json j = V3();
  j["num_experts_per_tok"] = 17;
  ExpectRejected(j, "num_experts_per_tok = 17", "<= n_routed_experts (16)");
}

TEST(ConfigTest, ExpertsNotDivisibleIntoGroups) {
  json j = V3();
  j["n_group"] = 3;
  ExpectRejected(j, "n_routed_experts = 16", "multiple of n_group (3)");
}

TEST(ConfigTest, TopkGroupAboveGroups) {
  json j = V3();
  j["topk_group"] = 5;
  ExpectRejected(j, "topk_group = 5", "<= n_group (4)");
}

TEST(ConfigTest, NoauxTcGroupsNeedTwoExperts) {
  json j = V3();
  j["n_group"] = 16;
  j["topk_group"] = 4;
  ExpectRejected(j, "n_group = 16", "each group needs >= 2 experts");
  j["topk_method"] = "greedy";
  EXPECT_TRUE(Parse(j).ok());
}

TEST(ConfigTest, SurvivingGroupsTooSmallForTopk) {
  // 2 surviving groups of 4 experts cannot supply 9 picks.
  json j = V3();
  j["num_experts_per_tok"] = 9;
  ExpectRejected(j, "num_experts_per_tok = 9", "topk_group * experts per group (2 * 4)");
}

TEST(ConfigTest, UnknownRoutingNames) {
  json j = V3();
  j["topk_method"] = "random";
  ExpectRejected(j, "topk_method", "'random'");
  j = V3();
  j["scoring_func"] = "tanh";
  ExpectRejected(j, "scoring_func", "'tanh'");
}

TEST(ConfigTest, OddRopeHeadDim) {
  json j = V3();
  j["qk_rope_head_dim"] = 15;
  ExpectRejected(j, "qk_rope_head_dim = 15", "even");
}

TEST(ConfigTest, FirstKDenseAboveLayers) {
  json j = V3();
  j["first_k_dense_replace"] = 5;
  ExpectRejected(j, "first_k_dense_replace = 5", "num_hidden_layers (4)");
}

TEST(ConfigTest, NextnLayersZeroOrOne) {
  json j = V3();
  j["num_nextn_predict_layers"] = 2;
  ExpectRejected(j, "num_nextn_predict_layers = 2", "0 or 1");
}

TEST(ConfigTest, NonPositiveEps) {
  json j = V3();
  j["rms_norm_eps"] = 0;
  ExpectRejected(j, "rms_norm_eps = 0", "> 0");
}

TEST(ConfigTest, EosOutsideVocab) {
  json j = V3();
  j["eos_token_id"] = 1024;
  ExpectRejected(j, "eos_token_id = 1024", "vocab_size (1024)");
}

TEST(ConfigTest, YarnFactorBelowOne) {
  json j = V3();
  j["rope_scaling"]["factor"] = 0.5;
  ExpectRejected(j, "rope_scaling.factor = 0.5", ">= 1");
}

TEST(ConfigTest, OtherRopeScalingTypes) {
  json j = V3();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ExpectRejected(j, "rope_scaling", "'linear' is not supported");
  j["rope_scaling"] = {{"factor", 2.0}};
  ExpectRejected(j, "rope_scaling.rope_type", "missing");
}

}  // namespace
}  // namespace moe
