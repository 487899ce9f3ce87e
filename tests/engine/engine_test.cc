// The engine batches without changing results: every request's greedy output is the same alone
// or in a batch of 64 mixed-length requests with chunked prefill, prefix-cache hits and
// preemption, under f32: tokens identical, log-probs within 1e-4 (a batch may order float sums
// differently, and a recomputed or chunked position may attend in the other MLA form).
#include "engine/engine.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace moe {
namespace {

struct Result {
  std::vector<int32_t> tokens;
  std::vector<double> top_logprobs;
  int64_t cached = 0;
};

std::map<RequestId, Result> RunAll(Engine& engine, const std::vector<EngineRequest>& requests) {
  for (const EngineRequest& r : requests) {
    const Status s = engine.AddRequest(r);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  std::map<RequestId, Result> results;
  for (int steps = 0; engine.HasUnfinishedRequests(); ++steps) {
    EXPECT_LT(steps, 100000) << "the engine does not finish";
    if (steps >= 100000) break;
    for (const RequestOutput& out : engine.Step()) {
      Result& r = results[out.id];
      r.tokens.insert(r.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      for (const auto& top : out.new_logprobs) r.top_logprobs.push_back(top[0].logprob);
      r.cached = std::max(r.cached, out.num_cached_tokens);
    }
  }
  return results;
}

std::vector<EngineRequest> MixedRequests(int count, int64_t vocab) {
  std::mt19937 rng(1234);
  std::vector<int32_t> shared(48);
  for (int32_t& t : shared) t = static_cast<int32_t>(rng() % vocab);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < count; ++i) {
    EngineRequest r;
    r.id = i;
    // A third share a 48-token prefix, so later ones hit the prefix cache.
    if (i % 3 == 0) r.prompt = shared;
    const int extra = 1 + static_cast<int>(rng() % 40);
    for (int j = 0; j < extra; ++j) r.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    r.max_tokens = 3 + static_cast<int64_t>(rng() % 10);
    r.sampling.temperature = 0;
    r.logprobs = 1;
    r.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  return requests;
}

TEST(EngineBatchingTest, BatchedEqualsAloneF32) {
  const std::string dir = std::string(MOE_TINY_CHECKPOINT_ROOT) + "/v3";
  auto model = DeepseekV3Model::Load(dir, DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status().message();
  LocalExpertBackend experts;
  const std::vector<EngineRequest> requests = MixedRequests(64, (*model)->config().vocab_size);

  std::map<RequestId, Result> alone;
  for (const EngineRequest& r : requests) {
    EngineConfig roomy;
    roomy.enable_prefix_caching = false;
    roomy.kv_cache_memory_bytes = 256 * (*model)->LatentCacheBytesPerToken();
    Engine engine(**model, experts, roomy);
    alone[r.id] = RunAll(engine, {r})[r.id];
  }

  EngineConfig tight;
  tight.block_size = 4;
  tight.scheduler.max_num_batched_tokens = 64;  // prompts arrive in chunks
  tight.scheduler.max_num_seqs = 64;
  tight.scheduler.prefill_bucket_bounds = {8, 32};
  // About 120 tokens of latent cache for 64 requests of up to 100: preemption is certain.
  tight.kv_cache_memory_bytes = 30 * 4 * (*model)->LatentCacheBytesPerToken();
  Engine engine(**model, experts, tight);
  const std::map<RequestId, Result> batched = RunAll(engine, requests);

  EXPECT_GT(engine.num_preemptions(), 0);
  int64_t cached = 0;
  for (const EngineRequest& r : requests) {
    const Result& a = alone.at(r.id);
    const Result& b = batched.at(r.id);
    EXPECT_EQ(b.tokens, a.tokens) << "request " << r.id;
    ASSERT_EQ(b.top_logprobs.size(), a.top_logprobs.size());
    for (size_t i = 0; i < a.top_logprobs.size(); ++i) {
      EXPECT_NEAR(b.top_logprobs[i], a.top_logprobs[i], 1e-4) << "request " << r.id << " token " << i;
    }
    cached += b.cached;
  }
  EXPECT_GT(cached, 0) << "no request hit the prefix cache";
}

TEST(EnginePrefixCacheTest, SharedSystemPromptIsComputedOnce) {
  auto model = DeepseekV3Model::Load(std::string(MOE_TINY_CHECKPOINT_ROOT) + "/v3", DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status().message();
  LocalExpertBackend experts;
  std::vector<int32_t> system(1024);
  for (size_t i = 0; i < system.size(); ++i) system[i] = static_cast<int32_t>((i * 7 + 3) % 250);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 3; ++i) {
    EngineRequest r;
    r.id = i;
    r.prompt = system;
    r.prompt.push_back(10 + i);
    r.max_tokens = 4;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    requests.push_back(r);
  }
  EngineConfig config;
  config.kv_cache_memory_bytes = 4096 * (*model)->LatentCacheBytesPerToken();
  Engine engine(**model, experts, config);
  const Result first = RunAll(engine, {requests[0]})[0];
  EXPECT_EQ(first.cached, 0);
  for (int i = 1; i < 3; ++i) {
    const Result again = RunAll(engine, {requests[i]})[i];
    EXPECT_EQ(again.cached, 1024) << "request " << i << " recomputed the shared prompt";
    Engine fresh(**model, experts, config);
    EXPECT_EQ(again.tokens, RunAll(fresh, {requests[i]})[i].tokens);
  }
  EXPECT_EQ(engine.scheduler().kv_cache().prefix_cache_stats().hit_tokens, 2 * 1024);
}

}  // namespace
}  // namespace moe
