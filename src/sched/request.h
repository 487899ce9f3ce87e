// A generation request as the scheduler sees it: token ids and counters, no text, no tensors.
//
// Life cycle:
//   kWaiting --admitted--> kRunning --engine says stop--> kFinishedStopped
//                            |   \----max_tokens reached--> kFinishedLength
//                            |  ^
//                  preempted v  | re-admitted
//                         kPreempted   (back in the waiting queue, its KV dropped; it recomputes)
//   any unfinished state --Abort--> kFinishedAborted
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace moe {

enum class RequestStatus {
  kWaiting,
  kRunning,
  kPreempted,
  kFinishedStopped,
  kFinishedLength,
  kFinishedAborted,
};

const char* RequestStatusName(RequestStatus status);

inline bool IsFinished(RequestStatus status) {
  return status == RequestStatus::kFinishedStopped || status == RequestStatus::kFinishedLength ||
         status == RequestStatus::kFinishedAborted;
}

// What a caller submits.
struct NewRequest {
  RequestId id = 0;
  std::vector<int32_t> prompt_token_ids = {};
  int64_t max_tokens = 1;  // outputs to generate at most; at least 1
  int32_t priority = 0;    // under the priority policy, smaller values run first
  uint64_t cache_salt = 0;  // see kv/block_hash.h
  // Prompt tokens whose KV another instance computed (prefill/decode disaggregation): the engine
  // loads it into the blocks the scheduler allocates for them. At most the prompt length - 1.
  int64_t num_external_computed_tokens = 0;
};

// The scheduler owns and changes these; everyone else reads them through const references.
struct Request {
  RequestId id = 0;
  std::vector<int32_t> token_ids;  // the prompt, then the outputs
  int64_t num_prompt_tokens = 0;
  int64_t max_tokens = 1;
  int32_t priority = 0;
  uint64_t cache_salt = 0;
  int64_t num_external_computed_tokens = 0;  // reset on preemption: that KV is gone
  int64_t arrival = 0;                       // order of AddRequest calls

  RequestStatus status = RequestStatus::kWaiting;
  int64_t num_computed_tokens = 0;  // tokens whose KV is in the cache
  std::vector<int32_t> draft_token_ids;  // proposals to verify at the next decode
  int64_t num_cached_tokens = -1;  // prefix-cache hit at the first admission; -1 before it
  int64_t num_preemptions = 0;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  std::span<const int32_t> prompt_token_ids() const {
    return std::span(token_ids).first(num_prompt_tokens);
  }
  std::span<const int32_t> output_token_ids() const {
    return std::span(token_ids).subspan(num_prompt_tokens);
  }
  // A decode computes only the last sampled token (plus drafts); anything else is a prefill,
  // including a preempted request recomputing its outputs.
  bool is_decoding() const {
    return num_output_tokens() > 0 && num_tokens() - num_computed_tokens == 1;
  }
};

}  // namespace moe
