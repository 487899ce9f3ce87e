#include "engine/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include <gtest/gtest.h>

namespace moe {
namespace {

std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::map<int32_t, double> Frequencies(const std::vector<float>& logits, const SamplingParams& params, int draws) {
  Sampler sampler(params.seed);
  std::map<int32_t, double> counts;
  for (int i = 0; i < draws; ++i) counts[sampler.Sample(logits.data(), static_cast<int64_t>(logits.size()), params)] += 1.0 / draws;
  return counts;
}

TEST(SamplerTest, GreedyTakesTheMaxWithTiesToTheLowerId) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f};
  Sampler sampler(0);
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(sampler.Sample(logits.data(), 4, greedy), 1);
}

TEST(SamplerTest, SamplesInProportionToProbabilities) {
  SamplingParams params;
  params.seed = 7;
  const auto f = Frequencies(LogitsOf({0.5, 0.3, 0.2}), params, 20000);
  EXPECT_NEAR(f.at(0), 0.5, 0.02);
  EXPECT_NEAR(f.at(1), 0.3, 0.02);
  EXPECT_NEAR(f.at(2), 0.2, 0.02);
}

TEST(SamplerTest, SameSeedSameTokens) {
  const std::vector<float> logits = LogitsOf({0.25, 0.25, 0.25, 0.25});
  SamplingParams params;
  params.seed = 42;
  Sampler a(params.seed), b(params.seed), c(params.seed + 1);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 64; ++i) {
    ta.push_back(a.Sample(logits.data(), 4, params));
    tb.push_back(b.Sample(logits.data(), 4, params));
    tc.push_back(c.Sample(logits.data(), 4, params));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(SamplerTest, TopKTopPAndMinPCutTheTail) {
  const std::vector<float> logits = LogitsOf({0.4, 0.3, 0.2, 0.1});
  SamplingParams top_k;
  top_k.top_k = 2;
  auto f = Frequencies(logits, top_k, 5000);
  EXPECT_EQ(f.count(2) + f.count(3), 0u);
  EXPECT_NEAR(f.at(0), 0.4 / 0.7, 0.03);

  SamplingParams top_p;
  top_p.top_p = 0.65;  // 0.4 + 0.3 reaches it
  f = Frequencies(logits, top_p, 5000);
  EXPECT_EQ(f.count(2) + f.count(3), 0u);

  SamplingParams min_p;
  min_p.min_p = 0.3;  // keeps p >= 0.12
  f = Frequencies(logits, min_p, 5000);
  EXPECT_EQ(f.count(3), 0u);
  EXPECT_NEAR(f.at(2), 0.2 / 0.9, 0.03);
}

TEST(SamplerTest, TemperatureSharpens) {
  SamplingParams cold;
  cold.temperature = 0.5;  // p^2 renormalized: 0.25, 0.09, 0.04 over 0.38
  const auto f = Frequencies(LogitsOf({0.5, 0.3, 0.2}), cold, 20000);
  EXPECT_NEAR(f.at(0), 0.25 / 0.38, 0.02);
}

TEST(PenaltiesTest, RepetitionPresenceAndFrequency) {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 1.0f};
  SamplingParams params;
  params.repetition_penalty = 2.0;
  params.presence_penalty = 0.5;
  params.frequency_penalty = 0.25;
  const std::vector<int32_t> prompt = {0, 1};
  const std::vector<int32_t> output = {2, 2};
  ApplyPenalties(logits.data(), 4, params, prompt, output);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);               // seen in the prompt: divided
  EXPECT_FLOAT_EQ(logits[1], -4.0f);              // negative: multiplied
  EXPECT_FLOAT_EQ(logits[2], 0.5f - 0.5f - 0.5f);  // repeated twice in the output
  EXPECT_FLOAT_EQ(logits[3], 1.0f);               // never seen
}

TEST(TopLogprobsTest, SortedAndNormalized) {
  const std::vector<float> logits = LogitsOf({0.1, 0.6, 0.3});
  const auto top = TopLogprobs(logits.data(), 3, 5);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 2);
  EXPECT_NEAR(top[0].logprob, std::log(0.6), 1e-6);
  EXPECT_NEAR(std::exp(top[0].logprob) + std::exp(top[1].logprob) + std::exp(top[2].logprob), 1.0, 1e-9);
}

TEST(TopLogprobsTest, SampledTokenOutsideTheTopKComesLast) {
  const std::vector<float> logits = LogitsOf({0.1, 0.6, 0.3});
  const auto top = TopLogprobs(logits.data(), 3, 1, 0);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 0);
  EXPECT_NEAR(top[1].logprob, std::log(0.1), 1e-6);
  EXPECT_EQ(TopLogprobs(logits.data(), 3, 1, 1).size(), 1u);
}

}  // namespace
}  // namespace moe
