// A stand-in for the model in scheduler tests. It keeps, for every cache slot, a fingerprint of
// what the slot's KV would depend on (the request's salt and every token up to that position),
// and each step:
//   1. loads the external KV the schedule asks for (another instance's prefill),
//   2. writes the new positions of every scheduled request,
//   3. checks that every position each request's attention reads holds the right fingerprint:
//      a prefix hit on the wrong block, a block freed or evicted while in use, or two requests
//      writing one block all show up here,
//   4. "samples": the k-th output of request r is ExpectedToken(r, k), drafts are verified
//      against it, and new drafts are proposed (right or wrong at random).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "sched/scheduler.h"

namespace moe::testing {

inline int32_t ExpectedToken(RequestId id, int64_t output_index) {
  return static_cast<int32_t>(1000 + (id * 7919 + output_index * 104729) % 50000);
}

class FakeEngine {
 public:
  FakeEngine(const Scheduler& scheduler, uint64_t seed = 1)
      : scheduler_(scheduler),
        block_size_(scheduler.kv_cache().block_size()),
        slots_(static_cast<size_t>(scheduler.kv_cache().capacity_tokens()), kUnwritten),
        rng_(seed) {}

  int64_t num_drafts = 0;         // drafts proposed after each sample
  double draft_accuracy = 0.5;    // chance that each draft is right
  int64_t num_computed_tokens = 0;  // tokens computed (not loaded) over all steps
  int64_t num_loaded_tokens = 0;    // external KV tokens loaded

  std::vector<RequestStepOutput> Run(const SchedulerOutput& step) {
    std::vector<std::vector<uint64_t>> fingerprints;
    for (const ScheduledRequest& s : step.requests) fingerprints.push_back(Fingerprints(s));
    for (size_t i = 0; i < step.requests.size(); ++i) {
      const ScheduledRequest& s = step.requests[i];
      for (int64_t p = s.kv_load_begin; p < s.kv_load_end; ++p) Slot(s, p) = fingerprints[i][p];
      num_loaded_tokens += s.kv_load_end - s.kv_load_begin;
    }
    for (size_t i = 0; i < step.requests.size(); ++i) {
      const ScheduledRequest& s = step.requests[i];
      for (int64_t p = s.position; p < End(s); ++p) Slot(s, p) = fingerprints[i][p];
      num_computed_tokens += End(s) - s.position;
    }
    std::vector<RequestStepOutput> outputs;
    for (size_t i = 0; i < step.requests.size(); ++i) {
      const ScheduledRequest& s = step.requests[i];
      for (int64_t p = 0; p < End(s); ++p) {
        EXPECT_EQ(Slot(s, p), fingerprints[i][p])
            << "request " << s.id << " reads wrong KV at position " << p;
      }
      if (s.samples) outputs.push_back(Sample(Get(s.id), s));
    }
    return outputs;
  }

 private:
  static constexpr uint64_t kUnwritten = ~uint64_t{0};

  const Request& Get(RequestId id) {
    const Request* request = scheduler_.Find(id);
    EXPECT_NE(request, nullptr) << "scheduled request " << id << " is unknown";
    return *request;
  }

  uint64_t& Slot(const ScheduledRequest& s, int64_t position) {
    const size_t block = static_cast<size_t>(position / block_size_);
    EXPECT_LT(block, s.block_ids.size()) << "position " << position << " has no block";
    return slots_.at(static_cast<size_t>(s.block_ids.at(block)) * block_size_ +
                     position % block_size_);
  }

  static int64_t End(const ScheduledRequest& s) {
    return s.position + static_cast<int64_t>(s.token_ids.size());
  }

  // Of every position the step reads or writes: its known tokens, then the drafts it verifies.
  std::vector<uint64_t> Fingerprints(const ScheduledRequest& s) {
    const Request& request = Get(s.id);
    std::vector<uint64_t> fingerprints;
    uint64_t f = request.cache_salt * 0x9e3779b97f4a7c15ULL + 1;
    for (int64_t p = 0; p < End(s); ++p) {
      const int32_t token = p < s.position ? request.token_ids[p] : s.token_ids[p - s.position];
      f = (f ^ static_cast<uint32_t>(token)) * 0x100000001b3ULL;
      fingerprints.push_back(f);
    }
    return fingerprints;
  }

  RequestStepOutput Sample(const Request& request, const ScheduledRequest& s) {
    RequestStepOutput output{.id = s.id};
    const int64_t first_draft = static_cast<int64_t>(s.token_ids.size()) - s.num_draft_tokens;
    for (int64_t j = 0;; ++j) {
      const int32_t truth = ExpectedToken(s.id, request.num_output_tokens() + j);
      output.sampled_token_ids.push_back(truth);
      if (j == s.num_draft_tokens || s.token_ids[first_draft + j] != truth) break;
    }
    const int64_t next = request.num_output_tokens() +
                         static_cast<int64_t>(output.sampled_token_ids.size());
    std::bernoulli_distribution right(draft_accuracy);
    for (int64_t j = 0; j < num_drafts; ++j) {
      const int32_t truth = ExpectedToken(s.id, next + j);
      output.draft_token_ids.push_back(right(rng_) ? truth : truth + 1);
    }
    return output;
  }

  const Scheduler& scheduler_;
  int64_t block_size_;
  std::vector<uint64_t> slots_;
  std::mt19937_64 rng_;
};

}  // namespace moe::testing
