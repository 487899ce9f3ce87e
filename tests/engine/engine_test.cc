// The engine batches without changing results: every request's greedy output is the same alone
// or in a batch of 64 mixed-length requests with chunked prefill, prefix-cache hits and forced
// preemption (a tiny cache), on a random tiny model and on the bundled default model.
// - w8a8: bit-identical. Every GEMM but the router's and lm_head's accumulates INT8 products
//   exactly in INT32, those two run a kernel whose sums for a row do not depend on the other rows,
//   every token attends in the absorbed form however its prompt was chunked, and the latent
//   attention splits a token's keys by how many it sees alone. So tokens and log-probs are equal,
//   not close.
// - f32: tokens identical, log-probs within 1e-4. oneDNN's F32 GEMMs choose their kernel by the
//   number of rows, so a row's sums may be ordered differently in a batch (log-prob differences
//   of up to 4.4e-6 measured on both models).
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

constexpr int64_t kLongPrefix = 520;  // past 512 keys the latent attention splits a token's keys
constexpr int64_t kShortPrefix = 48;
constexpr int64_t kMaxPrompt = kLongPrefix + 40;
constexpr int64_t kMaxOutput = 12;

// 64 greedy requests: every eighth shares a 520-token prefix, a third of the rest a 48-token one
// (later ones hit the prefix cache), the others are unique; each ends in 1-40 tokens of its own
// and asks for 3-12 tokens, every other one with log-probs.
std::vector<EngineRequest> MixedRequests(int count, int64_t vocab) {
  std::mt19937 rng(1234);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    return tokens;
  };
  const std::vector<int32_t> long_prefix = random_tokens(kLongPrefix), short_prefix = random_tokens(kShortPrefix);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < count; ++i) {
    EngineRequest r;
    r.id = i;
    if (i % 8 == 0) {
      r.prompt = long_prefix;
    } else if (i % 3 == 0) {
      r.prompt = short_prefix;
    }
    const std::vector<int32_t> tail = random_tokens(1 + static_cast<int64_t>(rng() % 40));
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.max_tokens = 3 + static_cast<int64_t>(rng() % (kMaxOutput - 2));
    r.sampling.temperature = 0;
    r.logprobs = i % 2;  // without log-probs a greedy request's lm_head runs only for its argmax
    r.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  return requests;
}

// Runs the 64 requests one at a time (a roomy cache, no prefix caching, every prompt in one
// chunk), then together (4-token blocks, 64-token steps, a cache of 150 blocks: prompts arrive in
// chunks, preemption is certain, shared prefixes hit the cache), and compares each request's
// outputs. logprob_tolerance 0 asks for bit-identical log-probs.
void ExpectBatchedEqualsAlone(const std::string& dir, DType dtype, double logprob_tolerance) {
  auto model = DeepseekV3Model::Load(dir, dtype);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const int64_t token_bytes = (*model)->LatentCacheBytesPerToken();
  LocalExpertBackend experts;
  const std::vector<EngineRequest> requests = MixedRequests(64, (*model)->config().vocab_size);

  std::map<RequestId, Result> alone;
  for (const EngineRequest& r : requests) {
    EngineConfig roomy;
    roomy.enable_prefix_caching = false;
    roomy.kv_cache_memory_bytes = (kMaxPrompt + kMaxOutput + 16) * token_bytes;
    Engine engine(**model, experts, roomy);
    alone[r.id] = RunAll(engine, {r})[r.id];
  }

  EngineConfig tight;
  tight.block_size = 4;
  tight.scheduler.max_num_batched_tokens = 64;  // prompts arrive in chunks
  tight.scheduler.max_num_seqs = 64;
  tight.scheduler.prefill_bucket_bounds = {8, 32};
  // 600 tokens of latent cache: the longest request fits alone, the 64 (6,871 tokens in all,
  // prompts and outputs) do not.
  tight.kv_cache_memory_bytes = 150 * 4 * token_bytes;
  Engine engine(**model, experts, tight);
  ASSERT_LT(engine.kv_capacity_tokens(), 1000);
  ASSERT_GE(engine.kv_capacity_tokens(), kMaxPrompt + kMaxOutput);
  const std::map<RequestId, Result> batched = RunAll(engine, requests);

  EXPECT_GT(engine.num_preemptions(), 0);
  EXPECT_GT(engine.scheduler().kv_cache().prefix_cache_stats().hit_tokens, 0) << "no prefix-cache hit";
  int64_t cached = 0, logprobs_off = 0;
  double max_diff = 0;
  std::vector<RequestId> token_mismatches;
  for (const EngineRequest& r : requests) {
    const Result& a = alone.at(r.id);
    const Result& b = batched.at(r.id);
    ASSERT_EQ(static_cast<int64_t>(a.tokens.size()), r.max_tokens) << "request " << r.id;
    ASSERT_EQ(b.top_logprobs.size(), a.top_logprobs.size()) << "request " << r.id;
    if (b.tokens != a.tokens) token_mismatches.push_back(r.id);
    for (size_t i = 0; i < a.top_logprobs.size(); ++i) {
      const double diff = std::abs(b.top_logprobs[i] - a.top_logprobs[i]);
      logprobs_off += !(diff <= logprob_tolerance);  // a NaN counts as off
      max_diff = std::max(max_diff, diff);
    }
    cached += b.cached;
  }
  EXPECT_EQ(token_mismatches, std::vector<RequestId>{}) << "requests whose tokens differ batched and alone";
  // With a tolerance of 0 this asks for log-probs equal to the last bit.
  EXPECT_EQ(logprobs_off, 0) << "log-probs further apart than " << logprob_tolerance << " (largest difference "
                             << max_diff << ")";
  EXPECT_GT(cached, 0) << "no request hit the prefix cache";
  std::printf("%s %s: %lld preemptions, %lld prefix-cache hit tokens, largest log-prob difference %.3g\n",
              dir.c_str(), std::string(DTypeName(dtype)).c_str(), static_cast<long long>(engine.num_preemptions()),
              static_cast<long long>(engine.scheduler().kv_cache().prefix_cache_stats().hit_tokens), max_diff);
}

const std::string kTinyModel = std::string(MOE_TINY_CHECKPOINT_ROOT) + "/v3";
const std::string kDefaultModel = MOE_DEFAULT_MODEL_DIR;

TEST(EngineBatchingTest, BatchedEqualsAloneW8a8TinyModel) { ExpectBatchedEqualsAlone(kTinyModel, DType::kI8, 0); }
TEST(EngineBatchingTest, BatchedEqualsAloneW8a8DefaultModel) {
  ExpectBatchedEqualsAlone(kDefaultModel, DType::kI8, 0);
}
TEST(EngineBatchingTest, BatchedEqualsAloneF32TinyModel) { ExpectBatchedEqualsAlone(kTinyModel, DType::kF32, 1e-4); }
TEST(EngineBatchingTest, BatchedEqualsAloneF32DefaultModel) {
  ExpectBatchedEqualsAlone(kDefaultModel, DType::kF32, 1e-4);
}

// Greedy requests pick the same tokens whether the lm_head finds every logit (log-probs asked for)
// or only what each row's maximum needs (kernels::MatmulTwoPart's argmax-only rows), in one batch.
void ExpectArgmaxHeadPicksTheSameTokens(const std::string& dir) {
  auto model = DeepseekV3Model::Load(dir, DType::kI8);
  ASSERT_TRUE(model.ok()) << model.status().message();
  LocalExpertBackend experts;
  std::vector<EngineRequest> full = MixedRequests(64, (*model)->config().vocab_size), argmax = full;
  for (EngineRequest& r : full) r.logprobs = 1;
  for (EngineRequest& r : argmax) r.logprobs = 0;
  EngineConfig config;
  config.kv_cache_memory_bytes = 64 * (kMaxPrompt + kMaxOutput + 16) * (*model)->LatentCacheBytesPerToken();
  Engine full_engine(**model, experts, config), argmax_engine(**model, experts, config);
  const std::map<RequestId, Result> a = RunAll(full_engine, full), b = RunAll(argmax_engine, argmax);
  for (const EngineRequest& r : full) {
    ASSERT_EQ(static_cast<int64_t>(a.at(r.id).tokens.size()), r.max_tokens) << "request " << r.id;
    EXPECT_EQ(b.at(r.id).tokens, a.at(r.id).tokens) << "request " << r.id;
  }
}

TEST(EngineArgmaxHeadTest, PicksTheSameTokensTinyModel) { ExpectArgmaxHeadPicksTheSameTokens(kTinyModel); }
TEST(EngineArgmaxHeadTest, PicksTheSameTokensDefaultModel) { ExpectArgmaxHeadPicksTheSameTokens(kDefaultModel); }

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
