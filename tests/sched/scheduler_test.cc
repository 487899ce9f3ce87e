#include "sched/scheduler.h"

#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "fake_engine.h"

namespace moe {
namespace {

using testing::ExpectedToken;
using testing::FakeEngine;

std::vector<int32_t> Iota(int64_t n, int32_t first = 1) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

NewRequest Prompt(RequestId id, int64_t num_tokens, int64_t max_tokens, int32_t first = 1) {
  return {.id = id, .prompt_token_ids = Iota(num_tokens, first), .max_tokens = max_tokens};
}

const ScheduledRequest* Scheduled(const SchedulerOutput& output, RequestId id) {
  for (const ScheduledRequest& s : output.requests) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

std::vector<RequestId> ScheduledIds(const SchedulerOutput& output) {
  std::vector<RequestId> ids;
  for (const ScheduledRequest& s : output.requests) ids.push_back(s.id);
  return ids;
}

std::vector<int32_t> ExpectedOutputs(RequestId id, int64_t n) {
  std::vector<int32_t> tokens;
  for (int64_t k = 0; k < n; ++k) tokens.push_back(ExpectedToken(id, k));
  return tokens;
}

// A scheduler driven by the fake engine, with every invariant checked after every step.
struct Harness {
  Harness(const SchedulerConfig& config, const KvCacheConfig& kv_config)
      : scheduler(config, kv_config), engine(scheduler) {}

  SchedulerOutput Step() {
    SchedulerOutput output = scheduler.Schedule();
    int64_t tokens = 0;
    for (const ScheduledRequest& s : output.requests) tokens += std::ssize(s.token_ids);
    EXPECT_EQ(output.num_batched_tokens, tokens);
    EXPECT_LE(output.num_batched_tokens, scheduler.config().max_num_batched_tokens);
    const std::vector<RequestStepOutput> results = engine.Run(output);
    for (Request& request : scheduler.UpdateFromOutput(results)) {
      finished.push_back(std::move(request));
    }
    const Status status = scheduler.CheckInvariants();
    EXPECT_TRUE(status.ok()) << status.message();
    return output;
  }

  void RunToCompletion() {
    for (int step = 0; scheduler.has_unfinished_requests(); ++step) {
      ASSERT_LT(step, 10000) << "no progress";
      Step();
    }
  }

  const Request* Finished(RequestId id) const {
    for (const Request& request : finished) {
      if (request.id == id) return &request;
    }
    return nullptr;
  }

  Scheduler scheduler;
  FakeEngine engine;
  std::vector<Request> finished;
};

TEST(SchedulerTest, RunsOneRequestToMaxTokens) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 4}, {.num_blocks = 16, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 10, 3));
  EXPECT_EQ(h.scheduler.Find(1)->status, RequestStatus::kWaiting);

  SchedulerOutput out = h.Step();
  ASSERT_EQ(out.requests.size(), 1u);
  const ScheduledRequest& prefill = out.requests[0];
  EXPECT_EQ(prefill.position, 0);
  EXPECT_EQ(prefill.token_ids, Iota(10));
  EXPECT_TRUE(prefill.is_prefill);
  EXPECT_TRUE(prefill.samples);
  EXPECT_EQ(prefill.block_ids.size(), 3u);
  EXPECT_EQ(h.scheduler.Find(1)->status, RequestStatus::kRunning);
  EXPECT_EQ(h.scheduler.Find(1)->num_computed_tokens, 10);

  out = h.Step();
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].position, 10);
  EXPECT_EQ(out.requests[0].token_ids, std::vector<int32_t>{ExpectedToken(1, 0)});
  EXPECT_FALSE(out.requests[0].is_prefill);

  h.Step();
  ASSERT_EQ(h.finished.size(), 1u);
  EXPECT_EQ(h.finished[0].status, RequestStatus::kFinishedLength);
  EXPECT_EQ(std::vector<int32_t>(h.finished[0].output_token_ids().begin(),
                                 h.finished[0].output_token_ids().end()),
            ExpectedOutputs(1, 3));
  EXPECT_FALSE(h.scheduler.has_unfinished_requests());
  EXPECT_EQ(h.scheduler.kv_cache().num_free_blocks(), 16);
}

TEST(SchedulerTest, EngineStopFinishesTheRequest) {
  Scheduler scheduler({.max_num_batched_tokens = 64, .max_num_seqs = 4},
                      {.num_blocks = 16, .block_size = 4});
  scheduler.AddRequest(Prompt(1, 5, 10));
  scheduler.Schedule();
  const std::vector<RequestStepOutput> results = {{.id = 1, .sampled_token_ids = {7},
                                                   .stopped = true}};
  std::vector<Request> finished = scheduler.UpdateFromOutput(results);
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].status, RequestStatus::kFinishedStopped);
  EXPECT_EQ(finished[0].num_output_tokens(), 1);
  EXPECT_EQ(scheduler.kv_cache().num_requests(), 0);
}

TEST(SchedulerTest, ChunksALongPromptWithinTheBudget) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 4}, {.num_blocks = 64, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 200, 1));
  const std::vector<int64_t> expected_chunks = {64, 64, 64, 8};
  for (size_t i = 0; i < expected_chunks.size(); ++i) {
    const SchedulerOutput out = h.Step();
    ASSERT_EQ(out.requests.size(), 1u);
    EXPECT_EQ(out.requests[0].position, 64 * static_cast<int64_t>(i));
    EXPECT_EQ(std::ssize(out.requests[0].token_ids), expected_chunks[i]);
    EXPECT_TRUE(out.requests[0].is_prefill);
    EXPECT_EQ(out.requests[0].samples, i + 1 == expected_chunks.size());
  }
  ASSERT_EQ(h.finished.size(), 1u);
  EXPECT_EQ(h.finished[0].output_token_ids()[0], ExpectedToken(1, 0));
}

TEST(SchedulerTest, LongPrefillThresholdLetsLongPromptsShareTheBudget) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 4, .long_prefill_token_threshold = 32},
            {.num_blocks = 64, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 100, 1));
  h.scheduler.AddRequest(Prompt(2, 100, 1, 500));
  for (int step = 0; step < 3; ++step) {
    const SchedulerOutput out = h.Step();
    ASSERT_EQ(out.requests.size(), 2u);
    EXPECT_EQ(out.requests[0].token_ids.size(), 32u);
    EXPECT_EQ(out.requests[1].token_ids.size(), 32u);
  }
  h.RunToCompletion();
  EXPECT_EQ(h.finished.size(), 2u);
}

TEST(SchedulerTest, DecodesAreNeverStalledByALongPrefill) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 8},
            {.num_blocks = 512, .block_size = 4});
  for (RequestId id = 1; id <= 4; ++id) h.scheduler.AddRequest(Prompt(id, 4, 100, 10 * id));
  h.Step();
  h.scheduler.AddRequest(Prompt(9, 1000, 1, 5000));
  int prefill_steps = 0;
  while (!h.Finished(9)) {
    const SchedulerOutput out = h.Step();
    for (RequestId id = 1; id <= 4; ++id) {
      const ScheduledRequest* decode = Scheduled(out, id);
      ASSERT_NE(decode, nullptr) << "decode " << id << " stalled";
      EXPECT_EQ(decode->token_ids.size(), 1u);
    }
    const ScheduledRequest* prefill = Scheduled(out, 9);
    ASSERT_NE(prefill, nullptr);
    // Decodes take their 4 tokens; the chunk gets the rest, so the budget is used exactly.
    if (!prefill->samples) {
      EXPECT_EQ(prefill->token_ids.size(), 60u);
      EXPECT_EQ(out.num_batched_tokens, 64);
    }
    ++prefill_steps;
  }
  EXPECT_EQ(prefill_steps, 17);  // ceil(1000 / 60)
}

TEST(SchedulerTest, PromptOfOneToken) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 4}, {.num_blocks = 16, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 1, 2));
  const SchedulerOutput out = h.Step();
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].token_ids.size(), 1u);
  EXPECT_TRUE(out.requests[0].is_prefill);
  EXPECT_TRUE(out.requests[0].samples);
  EXPECT_EQ(out.requests[0].block_ids.size(), 1u);
  h.RunToCompletion();
  ASSERT_EQ(h.finished.size(), 1u);
  EXPECT_EQ(h.finished[0].num_output_tokens(), 2);
}

TEST(SchedulerTest, PromptEqualToTheBudgetRunsInOneStep) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 4}, {.num_blocks = 64, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 64, 1));
  h.scheduler.AddRequest(Prompt(2, 65, 1, 100));
  SchedulerOutput out = h.Step();
  EXPECT_EQ(ScheduledIds(out), std::vector<RequestId>{1});
  EXPECT_EQ(out.num_batched_tokens, 64);
  EXPECT_TRUE(out.requests[0].samples);
  // One token over the budget: a full chunk, then the last token alone.
  out = h.Step();
  ASSERT_NE(Scheduled(out, 2), nullptr);
  EXPECT_EQ(Scheduled(out, 2)->token_ids.size(), 64u);
  EXPECT_FALSE(Scheduled(out, 2)->samples);
  out = h.Step();
  EXPECT_EQ(Scheduled(out, 2)->token_ids.size(), 1u);
  EXPECT_TRUE(Scheduled(out, 2)->samples);
}

TEST(SchedulerTest, MaxNumSeqsLimitsRunningRequests) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 2}, {.num_blocks = 64, .block_size = 4});
  for (RequestId id = 1; id <= 3; ++id) h.scheduler.AddRequest(Prompt(id, 4, 2, 10 * id));
  SchedulerOutput out = h.Step();
  EXPECT_EQ(ScheduledIds(out), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(h.scheduler.num_running(), 2);
  EXPECT_EQ(h.scheduler.num_waiting(), 1);
  out = h.Step();  // both finish
  EXPECT_EQ(ScheduledIds(out), (std::vector<RequestId>{1, 2}));
  out = h.Step();
  EXPECT_EQ(ScheduledIds(out), std::vector<RequestId>{3});
}

TEST(SchedulerTest, BucketingAdmitsTheHeadsBucketFirst) {
  const SchedulerConfig config = {.max_num_batched_tokens = 256, .max_num_seqs = 16,
                                  .prefill_bucket_bounds = {16, 128}};
  Harness h(config, {.num_blocks = 256, .block_size = 4});
  // Queue: 100, 10, 120, 12, 90 tokens. The head is in bucket (16, 128].
  const std::vector<int64_t> lengths = {100, 10, 120, 12, 90};
  for (size_t i = 0; i < lengths.size(); ++i) {
    h.scheduler.AddRequest(Prompt(static_cast<RequestId>(i + 1), lengths[i], 1,
                                  1000 * static_cast<int32_t>(i)));
  }
  const SchedulerOutput out = h.Step();
  EXPECT_EQ(ScheduledIds(out), (std::vector<RequestId>{1, 3, 5}));
  EXPECT_EQ(Scheduled(out, 5)->token_ids.size(), 36u);  // the budget's rest: a first chunk
  EXPECT_EQ(out.num_batched_tokens, 256);
}

TEST(SchedulerTest, BucketingFillsTheRestFromOtherBuckets) {
  const SchedulerConfig config = {.max_num_batched_tokens = 64, .max_num_seqs = 16,
                                  .prefill_bucket_bounds = {16, 128}};
  Harness h(config, {.num_blocks = 256, .block_size = 4});
  const std::vector<int64_t> lengths = {10, 100, 12, 120};
  for (size_t i = 0; i < lengths.size(); ++i) {
    h.scheduler.AddRequest(Prompt(static_cast<RequestId>(i + 1), lengths[i], 1,
                                  1000 * static_cast<int32_t>(i)));
  }
  const SchedulerOutput out = h.Step();
  EXPECT_EQ(ScheduledIds(out), (std::vector<RequestId>{1, 3, 2}));
  EXPECT_EQ(Scheduled(out, 2)->token_ids.size(), 42u);
}

TEST(SchedulerTest, WithoutBucketsAdmissionFollowsTheQueue) {
  Harness h({.max_num_batched_tokens = 256, .max_num_seqs = 16},
            {.num_blocks = 256, .block_size = 4});
  const std::vector<int64_t> lengths = {100, 10, 120, 12, 90};
  for (size_t i = 0; i < lengths.size(); ++i) {
    h.scheduler.AddRequest(Prompt(static_cast<RequestId>(i + 1), lengths[i], 1,
                                  1000 * static_cast<int32_t>(i)));
  }
  EXPECT_EQ(ScheduledIds(h.Step()), (std::vector<RequestId>{1, 2, 3, 4, 5}));
}

TEST(SchedulerTest, PriorityPolicyAdmitsAndPreemptsByPriority) {
  const SchedulerConfig config = {.max_num_batched_tokens = 64, .max_num_seqs = 2,
                                  .policy = SchedulingPolicy::kPriority};
  Harness h(config, {.num_blocks = 4, .block_size = 4});
  NewRequest low = Prompt(1, 6, 10);
  low.priority = 9;
  NewRequest high = Prompt(2, 6, 10, 100);
  high.priority = 0;
  h.scheduler.AddRequest(low);  // arrives first
  h.scheduler.AddRequest(high);
  EXPECT_EQ(ScheduledIds(h.Step()), (std::vector<RequestId>{2, 1}));
  // Both hold two blocks; at position 8 the high-priority request needs a third.
  SchedulerOutput out;
  for (int step = 0; step < 3; ++step) out = h.Step();
  EXPECT_EQ(out.preempted_ids, std::vector<RequestId>{1});
  EXPECT_EQ(ScheduledIds(out), std::vector<RequestId>{2});
  EXPECT_EQ(h.scheduler.Find(1)->status, RequestStatus::kPreempted);
  h.RunToCompletion();
  ASSERT_EQ(h.finished.size(), 2u);
  EXPECT_EQ(h.finished[0].id, 2);
  for (const Request& request : h.finished) {
    EXPECT_EQ(request.num_output_tokens(), 10);
    EXPECT_EQ(request.output_token_ids()[9], ExpectedToken(request.id, 9));
  }
}

TEST(SchedulerTest, PreemptedRequestResumesFromItsOwnCachedBlocks) {
  // 9 blocks of 4 tokens. A and B (12-token prompts, 16 outputs) each need up to 7 blocks.
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 2}, {.num_blocks = 9, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 12, 16));
  h.scheduler.AddRequest(Prompt(2, 12, 16, 100));
  h.scheduler.AddRequest(Prompt(3, 4, 1, 200));  // waits behind them (max_num_seqs)
  std::optional<int> preempted_at, resumed_at, third_at;
  for (int step = 1; h.scheduler.has_unfinished_requests(); ++step) {
    ASSERT_LT(step, 100);
    const SchedulerOutput out = h.Step();
    if (!out.preempted_ids.empty()) {
      EXPECT_EQ(out.preempted_ids, std::vector<RequestId>{2});
      preempted_at = step;
    }
    const ScheduledRequest* b = Scheduled(out, 2);
    if (preempted_at && !resumed_at && b) {
      resumed_at = step;
      // B's first two blocks survived; A evicted its last two (least recently used first).
      EXPECT_EQ(b->position, 8);
      EXPECT_TRUE(b->is_prefill);
      EXPECT_TRUE(b->samples);  // the recompute reaches B's last known token
    }
    if (!third_at && Scheduled(out, 3)) third_at = step;
  }
  // At position 16 A takes the last free block and B, last in line, preempts itself.
  EXPECT_EQ(preempted_at, 6);
  ASSERT_TRUE(resumed_at.has_value());
  // The preempted request went back to the queue's front: the third one never overtook it.
  EXPECT_GE(*third_at, *resumed_at);
  const Request* b = h.Finished(2);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->num_preemptions, 1);
  EXPECT_EQ(b->num_cached_tokens, 0);  // counted at its first admission only
  EXPECT_EQ(std::vector<int32_t>(b->output_token_ids().begin(), b->output_token_ids().end()),
            ExpectedOutputs(2, 16));
  EXPECT_EQ(h.scheduler.kv_cache().prefix_cache_stats().hit_tokens, 8);
}

TEST(SchedulerTest, NoAdmissionInAStepThatPreempts) {
  const SchedulerConfig config = {.max_num_batched_tokens = 64, .max_num_seqs = 2,
                                  .policy = SchedulingPolicy::kPriority};
  Harness h(config, {.num_blocks = 8, .block_size = 4});
  NewRequest first = Prompt(1, 12, 20);
  NewRequest victim = Prompt(2, 12, 10, 100);
  victim.priority = 5;
  NewRequest small = Prompt(3, 4, 1, 200);
  small.priority = 1;
  h.scheduler.AddRequest(first);
  h.scheduler.AddRequest(victim);
  h.Step();
  h.scheduler.AddRequest(small);  // waits: max_num_seqs
  // At position 16 the first request needs a fifth block and preempts the victim, which frees
  // four. The small request, now first in line, would fit, but memory just ran short: it waits.
  SchedulerOutput out;
  for (int step = 0; step < 5; ++step) out = h.Step();
  EXPECT_EQ(out.preempted_ids, std::vector<RequestId>{2});
  EXPECT_EQ(ScheduledIds(out), std::vector<RequestId>{1});
  EXPECT_EQ(ScheduledIds(h.Step()), (std::vector<RequestId>{1, 3}));
}

TEST(SchedulerTest, PreemptedRequestRecomputesWhatWasExternalKv) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 2}, {.num_blocks = 8, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 12, 20));
  NewRequest remote = Prompt(2, 12, 10, 100);
  remote.num_external_computed_tokens = 11;
  h.scheduler.AddRequest(remote);
  EXPECT_EQ(h.Step().requests[1].kv_load_end, 11);
  SchedulerOutput out;
  for (int step = 0; step < 5; ++step) out = h.Step();
  ASSERT_EQ(out.preempted_ids, std::vector<RequestId>{2});
  EXPECT_EQ(h.scheduler.Find(2)->num_external_computed_tokens, 0);
  // Back in, it uses what survived in the local cache and computes the rest: the other
  // instance is not asked for the KV again.
  while (!Scheduled(out, 2)) out = h.Step();
  EXPECT_EQ(Scheduled(out, 2)->kv_load_end, 0);
  h.RunToCompletion();
  EXPECT_EQ(h.Finished(2)->num_output_tokens(), 10);
}

TEST(SchedulerTest, AbortWhileWaitingFreesNothingAndSchedulesNothing) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 1}, {.num_blocks = 16, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 4, 5));
  h.scheduler.AddRequest(Prompt(2, 4, 5, 100));
  h.Step();
  const std::optional<Request> aborted = h.scheduler.Abort(2);
  ASSERT_TRUE(aborted.has_value());
  EXPECT_EQ(aborted->status, RequestStatus::kFinishedAborted);
  EXPECT_EQ(h.scheduler.num_waiting(), 0);
  h.RunToCompletion();
  EXPECT_EQ(h.finished.size(), 1u);
  EXPECT_FALSE(h.scheduler.Abort(2).has_value());
}

TEST(SchedulerTest, AbortMidPrefillFreesItsBlocksAtOnce) {
  Harness h({.max_num_batched_tokens = 16, .max_num_seqs = 4}, {.num_blocks = 32, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 100, 5));
  h.Step();
  EXPECT_EQ(h.scheduler.kv_cache().num_free_blocks(), 28);
  ASSERT_TRUE(h.scheduler.Abort(1).has_value());
  EXPECT_EQ(h.scheduler.kv_cache().num_free_blocks(), 32);
  EXPECT_EQ(h.scheduler.kv_cache().num_requests(), 0);
  EXPECT_TRUE(h.Step().requests.empty());
}

TEST(SchedulerTest, AbortWhileRunning) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 4}, {.num_blocks = 16, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 6, 50));
  h.scheduler.AddRequest(Prompt(2, 6, 3, 100));
  h.Step();
  h.Step();
  const std::optional<Request> aborted = h.scheduler.Abort(1);
  ASSERT_TRUE(aborted.has_value());
  EXPECT_EQ(aborted->num_output_tokens(), 2);
  EXPECT_EQ(h.scheduler.kv_cache().num_requests(), 1);
  h.RunToCompletion();
  ASSERT_EQ(h.finished.size(), 1u);
  EXPECT_EQ(h.finished[0].id, 2);
}

TEST(SchedulerTest, AbortAfterScheduleIgnoresTheStepsResults) {
  Scheduler scheduler({.max_num_batched_tokens = 64, .max_num_seqs = 4},
                      {.num_blocks = 16, .block_size = 4});
  scheduler.AddRequest(Prompt(1, 6, 5));
  scheduler.Schedule();
  ASSERT_TRUE(scheduler.Abort(1).has_value());
  EXPECT_EQ(scheduler.kv_cache().num_requests(), 0);
  const std::vector<RequestStepOutput> results = {{.id = 1, .sampled_token_ids = {3}}};
  EXPECT_TRUE(scheduler.UpdateFromOutput(results).empty());
  EXPECT_TRUE(scheduler.CheckInvariants().ok());
  EXPECT_FALSE(scheduler.has_unfinished_requests());
}

TEST(SchedulerTest, SpeculativeDecodeVerifiesDraftsAndKeepsAcceptedKv) {
  Scheduler scheduler({.max_num_batched_tokens = 64, .max_num_seqs = 4},
                      {.num_blocks = 16, .block_size = 4});
  scheduler.AddRequest(Prompt(1, 8, 5));
  scheduler.Schedule();
  std::vector<RequestStepOutput> results = {
      {.id = 1, .sampled_token_ids = {50}, .draft_token_ids = {51, 52, 53}}};
  scheduler.UpdateFromOutput(results);

  SchedulerOutput out = scheduler.Schedule();
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].position, 8);
  EXPECT_EQ(out.requests[0].token_ids, (std::vector<int32_t>{50, 51, 52, 53}));
  EXPECT_EQ(out.requests[0].num_draft_tokens, 3);
  EXPECT_FALSE(out.requests[0].is_prefill);
  EXPECT_EQ(out.requests[0].block_ids.size(), 3u);  // 12 slots
  // 51 accepted, 52 rejected: the engine's token 60 replaces it.
  results = {{.id = 1, .sampled_token_ids = {51, 60}, .draft_token_ids = {61, 62, 63}}};
  scheduler.UpdateFromOutput(results);
  const Request* request = scheduler.Find(1);
  EXPECT_EQ(request->num_computed_tokens, 10);  // 50 and 51 have KV; 60 does not yet
  EXPECT_EQ(request->num_tokens(), 11);

  // Two outputs left: only one draft can become an output.
  out = scheduler.Schedule();
  EXPECT_EQ(out.requests[0].token_ids, (std::vector<int32_t>{60, 61}));
  results = {{.id = 1, .sampled_token_ids = {61, 70}}};
  const std::vector<Request> finished = scheduler.UpdateFromOutput(results);
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].status, RequestStatus::kFinishedLength);
  EXPECT_EQ(std::vector<int32_t>(finished[0].output_token_ids().begin(),
                                 finished[0].output_token_ids().end()),
            (std::vector<int32_t>{50, 51, 60, 61, 70}));
}

TEST(SchedulerTest, DraftsAreTrimmedToTheBudget) {
  Scheduler scheduler({.max_num_batched_tokens = 2, .max_num_seqs = 1},
                      {.num_blocks = 16, .block_size = 4});
  scheduler.AddRequest(Prompt(1, 2, 10));
  scheduler.Schedule();
  const std::vector<RequestStepOutput> results = {
      {.id = 1, .sampled_token_ids = {50}, .draft_token_ids = {51, 52, 53}}};
  scheduler.UpdateFromOutput(results);
  const SchedulerOutput out = scheduler.Schedule();
  EXPECT_EQ(out.requests[0].token_ids, (std::vector<int32_t>{50, 51}));
  EXPECT_EQ(out.requests[0].num_draft_tokens, 1);
}

TEST(SchedulerTest, SpeculativeDecodingUnderTheFakeEngine) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 4, .num_lookahead_tokens = 3},
            {.num_blocks = 64, .block_size = 4});
  h.engine.num_drafts = 3;
  for (RequestId id = 1; id <= 3; ++id) h.scheduler.AddRequest(Prompt(id, 5 * id, 20, 100 * id));
  int steps = 0;
  for (; h.scheduler.has_unfinished_requests(); ++steps) {
    for (const ScheduledRequest& s : h.Step().requests) {
      // Lookahead slots stay reserved past the new tokens.
      EXPECT_GE(std::ssize(s.block_ids) * 4, s.position + std::ssize(s.token_ids) + 3);
    }
  }
  EXPECT_LT(steps, 20);  // some drafts were accepted
  for (const Request& request : h.finished) {
    EXPECT_EQ(std::vector<int32_t>(request.output_token_ids().begin(),
                                   request.output_token_ids().end()),
              ExpectedOutputs(request.id, 20));
  }
}

TEST(SchedulerTest, ExternallyComputedKvIsLoadedNotComputed) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 4}, {.num_blocks = 64, .block_size = 4});
  NewRequest request = Prompt(1, 50, 3);
  request.num_external_computed_tokens = 40;
  h.scheduler.AddRequest(request);
  const SchedulerOutput out = h.Step();
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].kv_load_begin, 0);
  EXPECT_EQ(out.requests[0].kv_load_end, 40);
  EXPECT_EQ(out.requests[0].position, 40);
  EXPECT_EQ(out.requests[0].token_ids.size(), 10u);
  EXPECT_EQ(out.requests[0].block_ids.size(), 13u);
  EXPECT_EQ(h.engine.num_loaded_tokens, 40);
  EXPECT_EQ(h.engine.num_computed_tokens, 10);
  h.RunToCompletion();
  EXPECT_EQ(h.finished[0].num_output_tokens(), 3);
}

TEST(SchedulerTest, ExternalKvCombinesWithLocalPrefixHits) {
  Harness h({.max_num_batched_tokens = 64, .max_num_seqs = 4}, {.num_blocks = 64, .block_size = 4});
  h.scheduler.AddRequest(Prompt(1, 41, 1));  // caches 10 full blocks: 40 tokens
  h.RunToCompletion();
  // The local cache covers 40 tokens; another instance computed 45: only 5 are loaded.
  NewRequest more = Prompt(2, 50, 1);
  more.num_external_computed_tokens = 45;
  h.scheduler.AddRequest(more);
  // The local cache covers more than the 20 external tokens: nothing is loaded.
  NewRequest fewer = Prompt(3, 50, 1);
  fewer.num_external_computed_tokens = 20;
  h.scheduler.AddRequest(fewer);
  const SchedulerOutput out = h.Step();
  ASSERT_EQ(out.requests.size(), 2u);
  EXPECT_EQ(out.requests[0].kv_load_begin, 40);
  EXPECT_EQ(out.requests[0].kv_load_end, 45);
  EXPECT_EQ(out.requests[0].position, 45);
  // Request 2's admission published blocks up to 48 tokens: request 3 hits them.
  EXPECT_EQ(out.requests[1].kv_load_end, 0);
  EXPECT_EQ(out.requests[1].position, 48);
  EXPECT_EQ(h.engine.num_loaded_tokens, 5);
}

class SharedPrefixTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(SharedPrefixTest, SharedSystemPromptIsComputedOnce) {
  constexpr int64_t kPrefix = 1024, kSuffix = 20, kRequests = 8;
  Harness h({.max_num_batched_tokens = GetParam(), .max_num_seqs = 16},
            {.num_blocks = 512, .block_size = 16});
  for (RequestId id = 0; id < kRequests; ++id) {
    NewRequest request = Prompt(id, kPrefix, 1);
    const std::vector<int32_t> suffix = Iota(kSuffix, 5000 + 100 * static_cast<int32_t>(id));
    request.prompt_token_ids.insert(request.prompt_token_ids.end(), suffix.begin(), suffix.end());
    h.scheduler.AddRequest(request);
  }
  h.RunToCompletion();
  EXPECT_EQ(h.engine.num_computed_tokens, kPrefix + kRequests * kSuffix);
  const PrefixCacheStats& stats = h.scheduler.kv_cache().prefix_cache_stats();
  EXPECT_EQ(stats.hit_tokens, (kRequests - 1) * kPrefix);
  EXPECT_EQ(stats.queried_tokens, kRequests * (kPrefix + kSuffix));
  ASSERT_EQ(h.finished.size(), static_cast<size_t>(kRequests));
  for (const Request& request : h.finished) {
    EXPECT_EQ(request.num_cached_tokens, request.id == 0 ? 0 : kPrefix);
    EXPECT_EQ(request.output_token_ids()[0], ExpectedToken(request.id, 0));
  }
}

// 2048: all eight in one step, sharing blocks published that same step. 512: the first request
// is chunked and the others join once the prefix is published.
INSTANTIATE_TEST_SUITE_P(Budgets, SharedPrefixTest, ::testing::Values(2048, 512));

TEST(SchedulerTest, CanFitCountsTheKvAFullRequestNeeds) {
  Scheduler scheduler({.max_num_batched_tokens = 64, .max_num_seqs = 4},
                      {.num_blocks = 16, .block_size = 4});
  EXPECT_TRUE(scheduler.CanFit(60, 5));  // 64 positions: the last output is never computed
  EXPECT_FALSE(scheduler.CanFit(60, 6));
  Scheduler lookahead({.max_num_batched_tokens = 64, .max_num_seqs = 4,
                       .num_lookahead_tokens = 2},
                      {.num_blocks = 16, .block_size = 4});
  EXPECT_FALSE(lookahead.CanFit(60, 5));
}

TEST(SchedulerDeathTest, MisuseIsCaught) {
  Scheduler scheduler({.max_num_batched_tokens = 64, .max_num_seqs = 4},
                      {.num_blocks = 16, .block_size = 4});
  EXPECT_DEATH(scheduler.UpdateFromOutput({}), "without a Schedule");
  scheduler.AddRequest(Prompt(1, 4, 1));
  EXPECT_DEATH(scheduler.AddRequest(Prompt(1, 4, 1)), "added twice");
  EXPECT_DEATH(scheduler.AddRequest(Prompt(2, 64, 2)), "never fit");
  scheduler.Schedule();
  EXPECT_DEATH(scheduler.Schedule(), "before UpdateFromOutput");
  const std::vector<RequestStepOutput> unscheduled = {{.id = 1, .sampled_token_ids = {1}},
                                                       {.id = 7, .sampled_token_ids = {1}}};
  EXPECT_DEATH(scheduler.UpdateFromOutput(unscheduled), "did not schedule");
}

}  // namespace
}  // namespace moe
