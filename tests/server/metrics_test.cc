#include "server/metrics.h"

#include <gtest/gtest.h>

namespace moe {
namespace {

TEST(Histogram, BucketsAreCumulativeWithSumAndCount) {
  Histogram h({0.1, 1});
  h.Observe(0.05);
  h.Observe(0.1);  // on a bound: counts in that bucket (le = less or equal)
  h.Observe(0.5);
  h.Observe(7);
  std::string out;
  h.Render("x", out);
  EXPECT_EQ(out,
            "x_bucket{le=\"0.1\"} 2\n"
            "x_bucket{le=\"1\"} 3\n"
            "x_bucket{le=\"+Inf\"} 4\n"
            "x_sum 7.65\n"
            "x_count 4\n");
}

TEST(ServingMetrics, RendersGaugesCountersAndExpertLoad) {
  ServingMetrics m;
  m.AddPromptTokens(10);
  m.AddGenerationTokens(4);
  m.CountFinished("stop");
  m.CountFinished("stop");
  m.ObserveTimeToFirstToken(0.2);
  EngineGauges g;
  g.num_running = 2;
  g.kv_cache_usage = 0.25;
  const std::string text = m.Render(g, {{3, {6, 2, 0, 0}}});
  EXPECT_NE(text.find("moe:num_requests_running 2\n"), std::string::npos);
  EXPECT_NE(text.find("moe:kv_cache_usage_perc 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("moe:prompt_tokens_total 10\n"), std::string::npos);
  EXPECT_NE(text.find("moe:request_success_total{finished_reason=\"stop\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("moe:time_to_first_token_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(text.find("moe:expert_tokens_total{layer=\"3\",expert=\"0\"} 6\n"), std::string::npos);
  EXPECT_NE(text.find("moe:expert_load_imbalance{layer=\"3\"} 3\n"), std::string::npos);  // 6 / mean 2
  EXPECT_NE(text.find("# TYPE moe:time_to_first_token_seconds histogram\n"), std::string::npos);
}

}  // namespace
}  // namespace moe
