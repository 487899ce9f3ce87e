// Many random requests through a scheduler with a tiny cache, driven by the fake engine, which
// checks the KV every attention would read. Every step must keep the scheduler's invariants and
// give every running decode its tokens; at the end every request not aborted must have finished
// with exactly max_tokens outputs, the right ones.
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include "fake_engine.h"
#include "sched/scheduler.h"

namespace moe {
namespace {

using testing::ExpectedToken;
using testing::FakeEngine;

struct SimulationCase {
  const char* name;
  SchedulerConfig config;
  bool prefix_caching = true;
  int64_t num_drafts = 0;
};

class SchedulerSimulationTest : public ::testing::TestWithParam<SimulationCase> {};

constexpr int kRequests = 150;
constexpr int32_t kBlocks = 24;
constexpr int32_t kBlockSize = 4;

void Simulate(const SimulationCase& test, uint64_t seed) {
  Scheduler scheduler(test.config, {.num_blocks = kBlocks,
                                    .block_size = kBlockSize,
                                    .enable_prefix_caching = test.prefix_caching});
  FakeEngine engine(scheduler, seed);
  engine.num_drafts = test.num_drafts;
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };

  // A few shared prefixes, so prefix hits and their interplay with preemption are common.
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> prefix;
    for (int64_t n = uniform(8, 30); n > 0; --n) {
      prefix.push_back(static_cast<int32_t>(uniform(1, 50)));
    }
    prefixes.push_back(prefix);
  }

  std::unordered_map<RequestId, int64_t> max_tokens;
  std::set<RequestId> unfinished, aborted;
  std::vector<Request> finished;
  RequestId next_id = 0;
  int64_t preemptions = 0;
  for (int step = 0; next_id < kRequests || !unfinished.empty(); ++step) {
    ASSERT_LT(step, 20000) << "no progress";
    for (int64_t n = uniform(0, 2); n > 0 && next_id < kRequests; --n, ++next_id) {
      NewRequest request{.id = next_id, .max_tokens = uniform(1, 25),
                         .priority = static_cast<int32_t>(uniform(0, 3)),
                         .cache_salt = chance(0.1) ? 1u : 0u};
      if (chance(0.7)) request.prompt_token_ids = prefixes[uniform(0, 2)];
      for (int64_t n = uniform(1, 30); n > 0; --n) {
        request.prompt_token_ids.push_back(static_cast<int32_t>(uniform(1, 50)));
      }
      const auto num_prompt = static_cast<int64_t>(request.prompt_token_ids.size());
      if (chance(0.2)) request.num_external_computed_tokens = uniform(0, num_prompt - 1);
      ASSERT_TRUE(scheduler.CanFit(num_prompt, request.max_tokens));
      max_tokens[next_id] = request.max_tokens;
      unfinished.insert(next_id);
      scheduler.AddRequest(std::move(request));
    }
    if (!unfinished.empty() && chance(0.03)) {
      const RequestId id = *std::next(unfinished.begin(), uniform(0, std::ssize(unfinished) - 1));
      ASSERT_TRUE(scheduler.Abort(id).has_value());
      unfinished.erase(id);
      aborted.insert(id);
    }

    std::vector<RequestId> decoding;
    for (RequestId id : unfinished) {
      const Request* request = scheduler.Find(id);
      if (request->status == RequestStatus::kRunning && request->is_decoding()) {
        decoding.push_back(id);
      }
    }
    const SchedulerOutput output = scheduler.Schedule();
    ASSERT_LE(output.num_batched_tokens, test.config.max_num_batched_tokens);
    ASSERT_LE(std::ssize(output.requests), test.config.max_num_seqs);
    std::set<RequestId> served(output.preempted_ids.begin(), output.preempted_ids.end());
    for (const ScheduledRequest& s : output.requests) served.insert(s.id);
    for (RequestId id : decoding) ASSERT_TRUE(served.contains(id)) << "decode " << id << " stalled";
    for (const ScheduledRequest& s : output.requests) {
      // External KV is loaded once: after a preemption the request recomputes it.
      if (s.kv_load_end > s.kv_load_begin) {
        ASSERT_EQ(scheduler.Find(s.id)->num_preemptions, 0);
      }
    }
    preemptions += std::ssize(output.preempted_ids);

    const std::vector<RequestStepOutput> results = engine.Run(output);
    if (::testing::Test::HasFailure()) return;
    // An abort between Schedule and UpdateFromOutput: the step ran, its results are dropped.
    if (!output.requests.empty() && chance(0.02)) {
      const RequestId id = output.requests[uniform(0, std::ssize(output.requests) - 1)].id;
      ASSERT_TRUE(scheduler.Abort(id).has_value());
      unfinished.erase(id);
      aborted.insert(id);
    }
    for (Request& request : scheduler.UpdateFromOutput(results)) {
      unfinished.erase(request.id);
      finished.push_back(std::move(request));
    }
    const Status status = scheduler.CheckInvariants();
    ASSERT_TRUE(status.ok()) << "step " << step << ": " << status.message();
  }

  ASSERT_EQ(std::ssize(finished) + std::ssize(aborted), kRequests) << "a request was lost";
  for (const Request& request : finished) {
    EXPECT_EQ(request.status, RequestStatus::kFinishedLength);
    ASSERT_EQ(request.num_output_tokens(), max_tokens.at(request.id));
    for (int64_t k = 0; k < request.num_output_tokens(); ++k) {
      ASSERT_EQ(request.output_token_ids()[k], ExpectedToken(request.id, k))
          << "request " << request.id << " output " << k;
    }
  }
  // The tiny pool must have exercised preemption and, when on, the prefix cache.
  EXPECT_GT(preemptions, 0);
  if (test.prefix_caching) {
    EXPECT_GT(scheduler.kv_cache().prefix_cache_stats().hit_tokens, 0);
  }
  EXPECT_EQ(scheduler.kv_cache().num_free_blocks(), kBlocks);
}

TEST_P(SchedulerSimulationTest, EveryRequestFinishesWithExactlyItsMaxTokens) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Simulate(GetParam(), seed);
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, SchedulerSimulationTest,
    ::testing::Values(
        SimulationCase{.name = "fcfs",
                       .config = {.max_num_batched_tokens = 32, .max_num_seqs = 6}},
        SimulationCase{.name = "fcfs_chunked_buckets",
                       .config = {.max_num_batched_tokens = 24, .max_num_seqs = 6,
                                  .long_prefill_token_threshold = 8,
                                  .prefill_bucket_bounds = {8, 24}}},
        SimulationCase{.name = "priority_spec",
                       .config = {.max_num_batched_tokens = 32, .max_num_seqs = 6,
                                  .policy = SchedulingPolicy::kPriority,
                                  .num_lookahead_tokens = 2},
                       .num_drafts = 3},
        SimulationCase{.name = "priority_buckets_spec",
                       .config = {.max_num_batched_tokens = 40, .max_num_seqs = 8,
                                  .long_prefill_token_threshold = 12,
                                  .policy = SchedulingPolicy::kPriority,
                                  .prefill_bucket_bounds = {16}},
                       .num_drafts = 2},
        SimulationCase{.name = "no_prefix_cache",
                       .config = {.max_num_batched_tokens = 32, .max_num_seqs = 6},
                       .prefix_caching = false}),
    [](const ::testing::TestParamInfo<SimulationCase>& info) { return info.param.name; });

}  // namespace
}  // namespace moe
