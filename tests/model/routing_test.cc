// Routing rules checked on hand-computed cases.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "model/moe.h"

namespace moe {
namespace {

float Logit(double p) { return static_cast<float>(std::log(p / (1 - p))); }

ModelConfig V3Config() {
  ModelConfig c;
  c.model_type = "deepseek_v3";
  c.n_routed_experts = 8;
  c.n_group = 4;
  c.topk_group = 2;
  c.num_experts_per_tok = 2;
  c.topk_method = TopkMethod::kNoauxTc;
  c.scoring_func = ScoringFunc::kSigmoid;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  return c;
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed RouteOne(const ModelConfig& c, const std::vector<double>& scores, const std::vector<float>* bias) {
  std::vector<float> logits;
  for (double s : scores) logits.push_back(c.scoring_func == ScoringFunc::kSigmoid ? Logit(s) : static_cast<float>(s));
  Routed r{std::vector<int32_t>(c.num_experts_per_tok), std::vector<float>(c.num_experts_per_tok)};
  Route(c, logits.data(), bias ? bias->data() : nullptr, 1, r.ids.data(), r.weights.data());
  return r;
}

TEST(RoutingTest, NoauxTcDropsGroupsByTheirTopTwoSum) {
  // Group sums: A = 0.9 + 0.1 = 1.0, B = 1.2, C = 1.05, D = 0.4. Expert 0 has the best single
  // score, but its group A loses to B and C.
  const ModelConfig c = V3Config();
  const Routed r = RouteOne(c, {0.9, 0.1, 0.6, 0.6, 0.55, 0.5, 0.2, 0.2}, nullptr);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(r.weights[0], 1.25, 1e-6);  // 0.6 / 1.2 * 2.5
  EXPECT_NEAR(r.weights[1], 1.25, 1e-6);
}

TEST(RoutingTest, BiasSteersSelectionButNotWeights) {
  const ModelConfig c = V3Config();
  const std::vector<float> bias = {0, 0, 0, 0, 0, 0, 1.0f, 0.5f};  // group D: 1.2 + 0.7 = 1.9
  const Routed r = RouteOne(c, {0.9, 0.1, 0.6, 0.6, 0.55, 0.5, 0.2, 0.2}, &bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{6, 7}));
  EXPECT_NEAR(r.weights[0], 0.2 / 0.4 * 2.5, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.2 / 0.4 * 2.5, 1e-6);
}

TEST(RoutingTest, NegativeBiasMasksWholeGroups) {
  ModelConfig c = V3Config();
  c.topk_group = 1;
  const std::vector<float> bias = {-5, -5, -5, -5, 0, 0, -5, -5};
  const Routed r = RouteOne(c, {0.9, 0.8, 0.7, 0.6, 0.1, 0.3, 0.95, 0.9}, &bias);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{5, 4}));
  EXPECT_NEAR(r.weights[0], 0.3 / 0.4 * 2.5, 1e-6);
}

TEST(RoutingTest, TiesGoToTheLowerExpert) {
  ModelConfig c = V3Config();
  c.n_group = 1;
  c.topk_group = 1;
  const Routed r = RouteOne(c, {0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, nullptr);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
}

TEST(RoutingTest, V2SoftmaxGreedyWithoutRenormalization) {
  ModelConfig c = V3Config();
  c.model_type = "deepseek_v2";
  c.scoring_func = ScoringFunc::kSoftmax;
  c.topk_method = TopkMethod::kGreedy;
  c.norm_topk_prob = false;
  c.routed_scaling_factor = 1.0;
  const Routed r = RouteOne(c, {0, 1, 2, 3, 0, 0, 0, 0}, nullptr);
  const double z = 5 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 2}));
  EXPECT_NEAR(r.weights[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(r.weights[1], std::exp(2.0) / z, 1e-6);
}

TEST(RoutingTest, V2GroupLimitedGreedyUsesTheGroupMax) {
  ModelConfig c = V3Config();
  c.scoring_func = ScoringFunc::kSoftmax;
  c.topk_method = TopkMethod::kGroupLimitedGreedy;
  c.topk_group = 1;
  c.norm_topk_prob = false;
  // Group maxima: A = 3, B = 2.9; A holds the best expert but its second is poor.
  const Routed r = RouteOne(c, {3, -4, 2.9, 2.8, 0, 0, 0, 0}, nullptr);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
}

}  // namespace
}  // namespace moe
