// The engine: continuous batching of many requests over one model. Each Step() asks the scheduler
// which tokens of which requests to compute, runs them as one batch through the model over the
// paged latent cache, samples where a request reached its last known token, and reports tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/sampler.h"
#include "model/deepseek_v3.h"
#include "sched/scheduler.h"

namespace moe {

struct EngineConfig {
  SchedulerConfig scheduler;
  int32_t block_size = 16;
  // Latent cache size: the bytes of all layers' blocks; rounded down to whole blocks.
  int64_t kv_cache_memory_bytes = int64_t{1} << 30;
  bool enable_prefix_caching = true;
};

struct EngineRequest {
  RequestId id = 0;
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  int64_t min_tokens = 0;  // stop conditions are ignored before this many outputs
  SamplingParams sampling;
  int64_t logprobs = 0;  // top-k log-probs per output token
  std::optional<int32_t> eos_id;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  int32_t priority = 0;
};

struct RequestOutput {
  RequestId id = 0;
  std::vector<int32_t> new_token_ids;
  std::vector<std::vector<TokenLogprob>> new_logprobs;
  bool finished = false;
  std::string finish_reason;  // "stop", "length" or "abort" once finished
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens served from the prefix cache
};

class Engine {
 public:
  Engine(const DeepseekV3Model& model, ExpertBackend& experts, const EngineConfig& config);

  // Checks the request against the model and the cache (ids in the vocabulary, context length,
  // fits the cache alone) and queues it.
  Status AddRequest(EngineRequest request);
  // Ends a request now and frees its blocks; its last output says "abort". Unknown ids are ignored.
  void Abort(RequestId id);

  // One batch: the outputs of every request that produced a token or finished. A step with
  // nothing to run still enters the experts' exchanges (DeepseekV3Model::RunEmptyBatch): under
  // expert parallelism every rank steps when any rank has work.
  std::vector<RequestOutput> Step();

  bool HasUnfinishedRequests() const { return scheduler_.has_unfinished_requests(); }
  const Scheduler& scheduler() const { return scheduler_; }
  int64_t kv_capacity_tokens() const { return scheduler_.kv_cache().capacity_tokens(); }
  int64_t num_preemptions() const { return num_preemptions_; }

 private:
  struct Live {
    EngineRequest request;
    Sampler sampler;
  };

  // Samples the next token of a request from its logits row, with its penalties.
  int32_t SampleNext(Live& live, const Request& state, float* logits, RequestOutput& out);
  bool Stops(const Live& live, const Request& state, int32_t token) const;

  const DeepseekV3Model& model_;
  ExpertBackend& experts_;
  PagedKvCache cache_;
  Scheduler scheduler_;
  std::unordered_map<RequestId, Live> live_;
  std::vector<RequestOutput> aborted_;
  int64_t num_preemptions_ = 0;
};

// Blocks of `block_size` tokens that fit `memory_bytes` of latent cache for this model.
int32_t KvBlocksForMemory(const DeepseekV3Model& model, int32_t block_size, int64_t memory_bytes);

}  // namespace moe
