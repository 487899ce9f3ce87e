#include "engine/engine.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "base/thread_pool.h"

namespace moe {

int32_t KvBlocksForMemory(const DeepseekV3Model& model, int32_t block_size, int64_t memory_bytes) {
  const int64_t per_block = model.LatentCacheBytesPerToken() * block_size;
  return static_cast<int32_t>(std::min<int64_t>(memory_bytes / per_block, INT32_MAX));
}

Engine::Engine(const DeepseekV3Model& model, ExpertBackend& experts, const EngineConfig& config)
    : model_(model),
      experts_(experts),
      cache_(model.NewPagedCache(KvBlocksForMemory(model, config.block_size, config.kv_cache_memory_bytes),
                                 config.block_size)),
      scheduler_(config.scheduler, KvCacheConfig{static_cast<int32_t>(cache_.num_blocks), config.block_size,
                                                 config.enable_prefix_caching}) {}

Status Engine::AddRequest(EngineRequest request) {
  const ModelConfig& config = model_.config();
  const std::string name = "request " + std::to_string(request.id);
  if (live_.contains(request.id)) return Status::Error(name + ": the id is already in use");
  if (request.prompt.empty()) return Status::Error(name + ": the prompt is empty");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    const int32_t id = request.prompt[i];
    if (id < 0 || id >= config.vocab_size) {
      return Status::Error(name + ": prompt token " + std::to_string(i) + " has id " + std::to_string(id) +
                           ", outside the vocabulary [0, " + std::to_string(config.vocab_size) + ")");
    }
  }
  if (request.max_tokens < 1) return Status::Error(name + ": max_tokens must be at least 1");
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  if (prompt_tokens + request.max_tokens > config.max_position_embeddings) {
    return Status::Error(name + ": prompt of " + std::to_string(prompt_tokens) + " tokens plus max_tokens " +
                         std::to_string(request.max_tokens) + " exceeds the model's context of " +
                         std::to_string(config.max_position_embeddings) + " tokens");
  }
  if (!scheduler_.CanFit(prompt_tokens, request.max_tokens)) {
    return Status::Error(name + ": prompt of " + std::to_string(prompt_tokens) + " tokens plus max_tokens " +
                         std::to_string(request.max_tokens) + " exceeds the KV cache of " +
                         std::to_string(kv_capacity_tokens()) + " tokens");
  }
  scheduler_.AddRequest(NewRequest{.id = request.id,
                                   .prompt_token_ids = request.prompt,
                                   .max_tokens = request.max_tokens,
                                   .priority = request.priority});
  const uint64_t seed = request.sampling.seed;
  const RequestId id = request.id;
  live_.emplace(id, Live{std::move(request), Sampler(seed)});
  return Status::Ok();
}

void Engine::Abort(RequestId id) {
  if (!scheduler_.Abort(id)) return;
  live_.erase(id);
  RequestOutput out;
  out.id = id;
  out.finished = true;
  out.finish_reason = "abort";
  aborted_.push_back(std::move(out));
}

bool Engine::Stops(const Live& live, const Request& state, int32_t token) const {
  const EngineRequest& r = live.request;
  if (state.num_output_tokens() + 1 < r.min_tokens) return false;
  if (!r.ignore_eos && r.eos_id && token == *r.eos_id) return true;
  return std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) != r.stop_token_ids.end();
}

int32_t Engine::SampleNext(Live& live, const Request& state, float* logits, RequestOutput& out) {
  const int64_t vocab = model_.config().vocab_size;
  const EngineRequest& r = live.request;
  // Log-probs describe the model's own distribution, before penalties reshape it.
  std::vector<float> model_logits;
  if (r.logprobs > 0) model_logits.assign(logits, logits + vocab);
  ApplyPenalties(logits, vocab, r.sampling, state.prompt_token_ids(), state.output_token_ids());
  const int32_t token = live.sampler.Sample(logits, vocab, r.sampling);
  if (r.logprobs > 0) out.new_logprobs.push_back(TopLogprobs(model_logits.data(), vocab, r.logprobs, token));
  return token;
}

std::vector<RequestOutput> Engine::Step() {
  std::vector<RequestOutput> outputs = std::move(aborted_);
  aborted_.clear();
  const SchedulerOutput plan = scheduler_.Schedule();
  num_preemptions_ += static_cast<int64_t>(plan.preempted_ids.size());

  std::vector<SequenceChunk> chunks;
  std::vector<int64_t> sample_rows;  // the last row of each chunk that samples
  std::vector<const ScheduledRequest*> samplers;
  int64_t rows = 0;
  for (const ScheduledRequest& s : plan.requests) {
    chunks.push_back({s.token_ids, s.position, s.block_ids, scheduler_.Find(s.id)->num_prompt_tokens});
    rows += static_cast<int64_t>(s.token_ids.size());
    if (s.samples) {
      sample_rows.push_back(rows - 1);
      samplers.push_back(&s);
    }
  }

  std::vector<RequestStepOutput> step_outputs;
  if (chunks.empty()) {
    model_.RunEmptyBatch(experts_);
  } else {
    const Tensor hidden = model_.Forward(chunks, cache_, experts_);
    const int64_t width = hidden.dim(1), vocab = model_.config().vocab_size;
    Tensor last = Tensor::F32({static_cast<int64_t>(sample_rows.size()), width});
    for (size_t i = 0; i < sample_rows.size(); ++i) {
      std::memcpy(last.data<float>() + i * width, hidden.data<float>() + sample_rows[i] * width, width * sizeof(float));
    }
    // Plain greedy requests need only the largest logit, which an INT8 head finds cheaper.
    std::vector<bool> argmax_only;
    for (const ScheduledRequest* s : samplers) {
      const EngineRequest& r = live_.at(s->id).request;
      argmax_only.push_back(r.sampling.temperature <= 0 && !r.sampling.has_penalties() && r.logprobs == 0);
    }
    std::vector<int32_t> first_max(argmax_only.size());
    Tensor logits = model_.Logits(last.data<float>(), last.dim(0), argmax_only, first_max.data());
    // Requests sample on every thread: each has its own logits row and sampler (and seed).
    const auto n = static_cast<int64_t>(samplers.size());
    std::vector<std::pair<const Request*, Live*>> sampling(n);
    std::vector<RequestOutput> sampled(n);
    for (int64_t i = 0; i < n; ++i) sampling[i] = {scheduler_.Find(samplers[i]->id), &live_.at(samplers[i]->id)};
    ParallelFor(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const auto [state, live] = sampling[i];
        RequestOutput& out = sampled[i];
        out.id = samplers[i]->id;
        out.num_prompt_tokens = state->num_prompt_tokens;
        out.num_cached_tokens = std::max<int64_t>(state->num_cached_tokens, 0);
        // A greedy row whose head found its maximum needs no scan (the same token Sample picks).
        out.new_token_ids.push_back(first_max[i] >= 0 ? first_max[i]
                                                      : SampleNext(*live, *state, logits.data<float>() + i * vocab, out));
      }
    });
    for (int64_t i = 0; i < n; ++i) {
      const int32_t token = sampled[i].new_token_ids.front();
      step_outputs.push_back({.id = sampled[i].id, .sampled_token_ids = {token},
                              .stopped = Stops(*sampling[i].second, *sampling[i].first, token)});
      outputs.push_back(std::move(sampled[i]));
    }
  }

  for (const Request& done : scheduler_.UpdateFromOutput(step_outputs)) {
    auto it = std::find_if(outputs.begin(), outputs.end(), [&](const RequestOutput& o) { return o.id == done.id; });
    if (it == outputs.end()) continue;
    it->finished = true;
    it->finish_reason = done.status == RequestStatus::kFinishedStopped ? "stop" : "length";
    live_.erase(done.id);
  }
  return outputs;
}

}  // namespace moe
