// Continuous batching: each step, decide which requests compute how many tokens, under a token
// budget and a sequence limit, with the KV blocks to hold them. Pure logic: token ids, counters and
// block ids; the engine turns a SchedulerOutput into a forward pass and reports back.
//
// One step, as the engine drives it:
//   SchedulerOutput out = scheduler.Schedule();
//   ... load external KV where asked, run the forward over out.requests, sample ...
//   std::vector<Request> finished = scheduler.UpdateFromOutput(step_outputs);
// Every Schedule is followed by exactly one UpdateFromOutput, even for an empty step (data-parallel
// ranks step together). AddRequest and Abort may come at any time, from the thread that steps:
// nothing here locks.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache_manager.h"
#include "sched/request.h"

namespace moe {

enum class SchedulingPolicy {
  kFcfs,      // arrival order
  kPriority,  // smaller Request::priority first, then arrival order
};

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;  // token budget of one step; at least max_num_seqs
  int64_t max_num_seqs = 64;              // running requests at most
  // Longest prefill chunk of one request in one step (0: only the budget limits it), so several
  // long prompts progress together and none takes a whole step's budget.
  int64_t long_prefill_token_threshold = 0;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // Ascending upper bounds of prompt-length buckets for admitting waiting requests; a prompt
  // longer than the last bound falls in one more, open bucket. Empty: one bucket. See Schedule.
  // (Vector members get "= {}" so designated initializers may leave them out under -Wextra.)
  std::vector<int64_t> prefill_bucket_bounds = {};
  // KV slots reserved past each scheduled request's tokens, e.g. for a drafter that writes KV.
  int64_t num_lookahead_tokens = 0;
};

// One request's share of a step.
struct ScheduledRequest {
  RequestId id = 0;
  int64_t position = 0;            // of token_ids[0]: the request's computed tokens so far
  std::vector<int32_t> token_ids;  // computed this step: known tokens, then drafts to verify
  int64_t num_draft_tokens = 0;    // the last this-many of token_ids
  std::vector<BlockId> block_ids;  // the whole block table, slots past the new tokens included
  bool is_prefill = false;         // not a decode: a prompt chunk, or a recompute after preemption
  // The new tokens reach the last known token, so the engine samples (and verifies the drafts);
  // false for a prefill chunk that is not the prompt's last.
  bool samples = false;
  // Positions [kv_load_begin, kv_load_end) hold KV computed by another instance: the engine loads
  // it into the blocks before the forward. Empty for a request without external KV.
  int64_t kv_load_begin = 0;
  int64_t kv_load_end = 0;
};

// A request may read KV that a request before it in `requests` writes in this same step (a
// prefix hit on blocks published this step), so the engine writes a layer's KV for every request
// before that layer's attention reads any.
struct SchedulerOutput {
  std::vector<ScheduledRequest> requests;  // running requests in policy order, then admissions
  int64_t num_batched_tokens = 0;          // sum of the requests' token_ids sizes
  std::vector<RequestId> preempted_ids;    // KV dropped this step: they recompute when re-admitted
};

// The engine's report for one scheduled request. A request left out samples nothing, which is
// right only for a prefill chunk that does not sample.
struct RequestStepOutput {
  RequestId id = 0;
  // Accepted drafts then one more sampled token; empty when the step did not sample. At most the
  // outputs the request still may produce.
  std::vector<int32_t> sampled_token_ids = {};
  bool stopped = false;                   // a stop condition hit at the last sampled token
  std::vector<int32_t> draft_token_ids = {};  // proposals to verify in the next step (MTP)
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv_config);

  // Whether a request could ever run: its KV at full length fits the cache alone. The engine
  // rejects requests that don't, before AddRequest.
  bool CanFit(int64_t num_prompt_tokens, int64_t max_tokens) const;

  // Queues a request. Its id must be new and it must pass CanFit; the prompt must not be empty.
  void AddRequest(NewRequest request);

  // Ends a request now, whatever its state, and frees its blocks. Returns the request (status
  // kFinishedAborted), or nothing for an unknown id (e.g. one that already finished). Called
  // between Schedule and UpdateFromOutput, the step still runs for it and its blocks are not
  // handed out again before the next Schedule; its results are ignored.
  std::optional<Request> Abort(RequestId id);

  // Builds the next step.
  //  1. Running requests, in policy order. Decodes take 1 token plus their drafts; the tokens of
  //     every decode are reserved first, so a prefill chunk gets only the budget they leave and a
  //     long prefill never stalls decodes. A partially computed prompt continues with the next
  //     chunk. A request that cannot get blocks preempts the last running request in policy order
  //     (lowest priority, latest arrival), repeatedly, possibly itself; that victim has not been
  //     scheduled this step, so no block of this step's batch is ever freed.
  //  2. Waiting requests, unless step 1 preempted (the cache is short; admitting would thrash):
  //     each looks up its prefix in the cache (hits and external KV count as computed), then its
  //     first chunk is allocated, until the budget, max_num_seqs or the blocks run out.
  // Prefill bucketing: waiting requests from the bucket of the queue's head (by tokens to compute)
  // are admitted first, in queue order, then the others, in queue order. A step's prefills then
  // have similar lengths (their attention costs and padded shapes match), short prompts that
  // queue with the head are not held behind a long one from another bucket, and the head, always
  // first, is never starved. Every prefill chunk is cut at the remaining budget and at
  // long_prefill_token_threshold, so each step carries a full, even token load while prompts wait.
  SchedulerOutput Schedule();

  // Applies the engine's results for the last Schedule: advances computed tokens (rejected drafts
  // excluded), appends sampled tokens, keeps new drafts, and finishes requests that stopped
  // (kFinishedStopped, even at max_tokens) or reached max_tokens (kFinishedLength). Returns the
  // requests finished here, their blocks already freed.
  std::vector<Request> UpdateFromOutput(std::span<const RequestStepOutput> outputs);

  const Request* Find(RequestId id) const;
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  bool has_unfinished_requests() const { return !requests_.empty(); }
  const KvCacheManager& kv_cache() const { return kv_; }
  const SchedulerConfig& config() const { return config_; }

  // The cache's invariants, plus: exactly the running requests hold blocks, enough of them for
  // their computed tokens, and every request is in exactly one queue.
  Status CheckInvariants() const;

 private:
  // What UpdateFromOutput needs of each request of the step in flight.
  struct InFlight {
    RequestId id;
    int64_t num_new_tokens;
    int64_t num_draft_tokens;
    bool samples;
  };

  bool RunsBefore(const Request& a, const Request& b) const;
  int PrefillBucket(const Request& request) const;
  int64_t ChunkLimit() const;
  // Tokens a decode wants this step: 1 plus the drafts that can still become outputs.
  int64_t DecodeTokens(const Request& request) const;
  SlotRequest Slots(const Request& request, int64_t num_computed_tokens, int64_t num_new_tokens,
                    const PrefixHit* prefix_hit) const;

  void ScheduleRunning(SchedulerOutput& output, int64_t& budget);
  void ScheduleWaiting(SchedulerOutput& output, int64_t& budget);
  // Allocates slots for a running request, preempting from the back of running_ until it fits.
  // False when the request itself was preempted. `decode_reserve` loses the victims' share.
  bool AllocateOrPreempt(Request& request, int64_t num_new_tokens, int64_t& decode_reserve,
                         SchedulerOutput& output);
  // Tries to admit a waiting request with a first chunk; false when its blocks do not fit.
  bool Admit(Request& request, int64_t& budget, SchedulerOutput& output);
  void Preempt(Request& request, SchedulerOutput& output);
  // Adds the request's share of the step, from its computed tokens on; [kv_load_begin,
  // kv_load_end) is external KV to load, empty for most.
  void AddScheduled(const Request& request, int64_t num_new_tokens, int64_t num_draft_tokens,
                    int64_t kv_load_begin, int64_t kv_load_end, SchedulerOutput& output);
  void InsertRunning(Request* request);
  void InsertWaiting(Request* request, bool preempted);
  Request Finish(Request& request, RequestStatus status);

  SchedulerConfig config_;
  KvCacheManager kv_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;  // all unfinished
  std::vector<Request*> running_;  // in policy order
  std::deque<Request*> waiting_;   // FCFS: arrivals at the back, preempted at the front;
                                   // priority: in policy order
  int64_t next_arrival_ = 0;
  std::optional<std::vector<InFlight>> in_flight_;  // the last Schedule's, until its results
};

}  // namespace moe
