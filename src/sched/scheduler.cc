#include "sched/scheduler.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_set>

namespace moe {

Scheduler::Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv_config)
    : config_(config), kv_(kv_config) {
  MOE_CHECK(config.max_num_seqs > 0, "max_num_seqs must be positive");
  // Below this a step could not carry one token of every running request.
  MOE_CHECK(config.max_num_batched_tokens >= config.max_num_seqs,
            "max_num_batched_tokens (%lld) below max_num_seqs (%lld)",
            static_cast<long long>(config.max_num_batched_tokens),
            static_cast<long long>(config.max_num_seqs));
  MOE_CHECK(config.long_prefill_token_threshold >= 0 && config.num_lookahead_tokens >= 0,
            "negative long_prefill_token_threshold or num_lookahead_tokens");
  const std::vector<int64_t>& bounds = config.prefill_bucket_bounds;
  for (size_t i = 0; i < bounds.size(); ++i) {
    MOE_CHECK(bounds[i] > 0 && (i == 0 || bounds[i] > bounds[i - 1]),
              "prefill_bucket_bounds must be positive and ascending");
  }
}

bool Scheduler::CanFit(int64_t num_prompt_tokens, int64_t max_tokens) const {
  // The last output is sampled but never computed, and drafts never run past max_tokens.
  return num_prompt_tokens + max_tokens - 1 + config_.num_lookahead_tokens <=
         kv_.capacity_tokens();
}

void Scheduler::AddRequest(NewRequest params) {
  const long long id = params.id;
  MOE_CHECK(!requests_.contains(params.id), "request %lld added twice", id);
  MOE_CHECK(!params.prompt_token_ids.empty(), "request %lld has an empty prompt", id);
  MOE_CHECK(params.max_tokens >= 1, "request %lld has max_tokens < 1", id);
  const auto num_prompt_tokens = static_cast<int64_t>(params.prompt_token_ids.size());
  MOE_CHECK(params.num_external_computed_tokens >= 0 &&
                params.num_external_computed_tokens < num_prompt_tokens,
            "request %lld: external KV must leave a prompt token to compute", id);
  MOE_CHECK(CanFit(num_prompt_tokens, params.max_tokens), "request %lld can never fit the cache",
            id);
  auto request = std::make_unique<Request>();
  request->id = params.id;
  request->token_ids = std::move(params.prompt_token_ids);
  request->num_prompt_tokens = num_prompt_tokens;
  request->max_tokens = params.max_tokens;
  request->priority = params.priority;
  request->cache_salt = params.cache_salt;
  request->num_external_computed_tokens = params.num_external_computed_tokens;
  request->arrival = next_arrival_++;
  InsertWaiting(request.get(), /*preempted=*/false);
  requests_.emplace(params.id, std::move(request));
}

std::optional<Request> Scheduler::Abort(RequestId id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return std::nullopt;
  return Finish(*it->second, RequestStatus::kFinishedAborted);
}

const Request* Scheduler::Find(RequestId id) const {
  const auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

bool Scheduler::RunsBefore(const Request& a, const Request& b) const {
  if (config_.policy == SchedulingPolicy::kPriority && a.priority != b.priority) {
    return a.priority < b.priority;
  }
  return a.arrival < b.arrival;
}

int Scheduler::PrefillBucket(const Request& request) const {
  const int64_t tokens = request.num_tokens() - request.num_external_computed_tokens;
  const std::vector<int64_t>& bounds = config_.prefill_bucket_bounds;
  return static_cast<int>(std::lower_bound(bounds.begin(), bounds.end(), tokens) - bounds.begin());
}

int64_t Scheduler::ChunkLimit() const {
  return config_.long_prefill_token_threshold > 0 ? config_.long_prefill_token_threshold
                                                  : std::numeric_limits<int64_t>::max();
}

int64_t Scheduler::DecodeTokens(const Request& request) const {
  const int64_t useful_drafts = request.max_tokens - request.num_output_tokens() - 1;
  return 1 + std::min(static_cast<int64_t>(request.draft_token_ids.size()), useful_drafts);
}

SlotRequest Scheduler::Slots(const Request& request, int64_t num_computed_tokens,
                             int64_t num_new_tokens, const PrefixHit* prefix_hit) const {
  return SlotRequest{.token_ids = request.token_ids,
                     .salt = request.cache_salt,
                     .num_computed_tokens = num_computed_tokens,
                     .num_new_tokens = num_new_tokens,
                     .num_lookahead_tokens = config_.num_lookahead_tokens,
                     .prefix_hit = prefix_hit};
}

SchedulerOutput Scheduler::Schedule() {
  MOE_CHECK(!in_flight_, "Schedule called again before UpdateFromOutput");
  SchedulerOutput output;
  int64_t budget = config_.max_num_batched_tokens;
  ScheduleRunning(output, budget);
  if (output.preempted_ids.empty()) ScheduleWaiting(output, budget);
  in_flight_.emplace();
  for (const ScheduledRequest& scheduled : output.requests) {
    in_flight_->push_back({scheduled.id, static_cast<int64_t>(scheduled.token_ids.size()),
                           scheduled.num_draft_tokens, scheduled.samples});
  }
  return output;
}

void Scheduler::ScheduleRunning(SchedulerOutput& output, int64_t& budget) {
  int64_t decode_reserve = 0;
  for (const Request* request : running_) {
    if (request->is_decoding()) decode_reserve += DecodeTokens(*request);
  }
  // Victims come from the back of running_, which this loop has not reached yet.
  for (size_t i = 0; i < running_.size(); ++i) {
    Request& request = *running_[i];
    const bool decoding = request.is_decoding();
    int64_t num_new_tokens;
    if (decoding) {
      const int64_t wanted = DecodeTokens(request);
      decode_reserve -= wanted;
      num_new_tokens = std::min(wanted, budget);
    } else {
      num_new_tokens = std::min({request.num_tokens() - request.num_computed_tokens, ChunkLimit(),
                                 budget - decode_reserve});
    }
    if (num_new_tokens <= 0) continue;
    if (!AllocateOrPreempt(request, num_new_tokens, decode_reserve, output)) break;
    budget -= num_new_tokens;
    AddScheduled(request, num_new_tokens, decoding ? num_new_tokens - 1 : 0, 0, 0, output);
  }
}

bool Scheduler::AllocateOrPreempt(Request& request, int64_t num_new_tokens,
                                  int64_t& decode_reserve, SchedulerOutput& output) {
  while (!kv_.AllocateSlots(request.id, Slots(request, request.num_computed_tokens,
                                              num_new_tokens, nullptr))) {
    Request& victim = *running_.back();
    if (&victim == &request) {
      Preempt(request, output);
      return false;
    }
    if (victim.is_decoding()) decode_reserve -= DecodeTokens(victim);
    Preempt(victim, output);
  }
  return true;
}

void Scheduler::ScheduleWaiting(SchedulerOutput& output, int64_t& budget) {
  if (waiting_.empty()) return;
  const int head_bucket = PrefillBucket(*waiting_.front());
  std::vector<Request*> candidates;
  for (Request* request : waiting_) {
    if (PrefillBucket(*request) == head_bucket) candidates.push_back(request);
  }
  for (Request* request : waiting_) {
    if (PrefillBucket(*request) != head_bucket) candidates.push_back(request);
  }
  for (Request* request : candidates) {
    if (num_running() >= config_.max_num_seqs || budget == 0) break;
    // Stopping at the first that does not fit keeps later, smaller requests from overtaking it.
    if (!Admit(*request, budget, output)) break;
  }
  std::erase_if(waiting_, [](const Request* r) { return r->status == RequestStatus::kRunning; });
}

bool Scheduler::Admit(Request& request, int64_t& budget, SchedulerOutput& output) {
  const PrefixHit hit = kv_.FindCachedPrefix(request.token_ids, request.cache_salt);
  const int64_t num_computed = std::max(hit.num_tokens, request.num_external_computed_tokens);
  const int64_t num_new_tokens =
      std::min({request.num_tokens() - num_computed, ChunkLimit(), budget});
  if (!kv_.AllocateSlots(request.id, Slots(request, num_computed, num_new_tokens, &hit))) {
    return false;
  }
  request.num_computed_tokens = num_computed;
  if (request.num_cached_tokens < 0) request.num_cached_tokens = hit.num_tokens;
  request.status = RequestStatus::kRunning;
  InsertRunning(&request);
  budget -= num_new_tokens;
  // Blocks the local cache did not have but another instance computed are loaded, not computed.
  AddScheduled(request, num_new_tokens, 0, hit.num_tokens, num_computed, output);
  return true;
}

void Scheduler::Preempt(Request& request, SchedulerOutput& output) {
  kv_.Free(request.id);
  request.num_computed_tokens = 0;
  request.num_external_computed_tokens = 0;
  request.draft_token_ids.clear();
  ++request.num_preemptions;
  std::erase(running_, &request);
  request.status = RequestStatus::kPreempted;
  InsertWaiting(&request, /*preempted=*/true);
  output.preempted_ids.push_back(request.id);
}

void Scheduler::AddScheduled(const Request& request, int64_t num_new_tokens,
                             int64_t num_draft_tokens, int64_t kv_load_begin, int64_t kv_load_end,
                             SchedulerOutput& output) {
  ScheduledRequest scheduled;
  scheduled.id = request.id;
  scheduled.position = request.num_computed_tokens;
  const int64_t num_known = num_new_tokens - num_draft_tokens;
  const auto first = request.token_ids.begin() + scheduled.position;
  scheduled.token_ids.assign(first, first + num_known);
  scheduled.token_ids.insert(scheduled.token_ids.end(), request.draft_token_ids.begin(),
                             request.draft_token_ids.begin() + num_draft_tokens);
  scheduled.num_draft_tokens = num_draft_tokens;
  scheduled.block_ids = kv_.block_table(request.id);
  scheduled.is_prefill = !request.is_decoding();
  scheduled.samples = scheduled.position + num_known == request.num_tokens();
  if (kv_load_end > kv_load_begin) {
    scheduled.kv_load_begin = kv_load_begin;
    scheduled.kv_load_end = kv_load_end;
  }
  output.num_batched_tokens += num_new_tokens;
  output.requests.push_back(std::move(scheduled));
}

void Scheduler::InsertRunning(Request* request) {
  const auto before = [this](const Request* a, const Request* b) { return RunsBefore(*a, *b); };
  running_.insert(std::upper_bound(running_.begin(), running_.end(), request, before), request);
}

void Scheduler::InsertWaiting(Request* request, bool preempted) {
  if (config_.policy == SchedulingPolicy::kPriority) {
    const auto before = [this](const Request* a, const Request* b) { return RunsBefore(*a, *b); };
    waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), request, before), request);
  } else if (preempted) {
    waiting_.push_front(request);
  } else {
    waiting_.push_back(request);
  }
}

Request Scheduler::Finish(Request& request, RequestStatus status) {
  if (request.status == RequestStatus::kRunning) {
    kv_.Free(request.id);
    std::erase(running_, &request);
  } else {
    std::erase(waiting_, &request);
  }
  request.status = status;
  Request finished = std::move(request);
  requests_.erase(finished.id);
  return finished;
}

std::vector<Request> Scheduler::UpdateFromOutput(std::span<const RequestStepOutput> outputs) {
  MOE_CHECK(in_flight_, "UpdateFromOutput without a Schedule");
  std::unordered_map<RequestId, const RequestStepOutput*> output_of;
  for (const RequestStepOutput& output : outputs) {
    MOE_CHECK(output_of.emplace(output.id, &output).second, "two outputs for request %lld",
              static_cast<long long>(output.id));
  }
  std::vector<Request> finished;
  for (const InFlight& step : *in_flight_) {
    const RequestStepOutput* output = nullptr;
    if (const auto it = output_of.find(step.id); it != output_of.end()) {
      output = it->second;
      output_of.erase(it);
    }
    const auto it = requests_.find(step.id);
    if (it == requests_.end()) continue;  // aborted after Schedule: its results mean nothing now
    Request& request = *it->second;
    const long long id = request.id;
    if (!step.samples) {
      MOE_CHECK(!output || output->sampled_token_ids.empty(),
                "request %lld sampled on a prefill chunk that does not end its prompt", id);
      request.num_computed_tokens += step.num_new_tokens;
      continue;
    }
    MOE_CHECK(output && !output->sampled_token_ids.empty(), "request %lld sampled nothing", id);
    const auto num_sampled = static_cast<int64_t>(output->sampled_token_ids.size());
    MOE_CHECK(num_sampled - 1 <= step.num_draft_tokens,
              "request %lld: more tokens accepted than drafted", id);
    MOE_CHECK(num_sampled <= request.max_tokens - request.num_output_tokens(),
              "request %lld: sampled past max_tokens", id);
    // KV is valid up to the last accepted draft; the positions of rejected drafts get recomputed.
    const int64_t num_rejected = step.num_draft_tokens - (num_sampled - 1);
    request.num_computed_tokens += step.num_new_tokens - num_rejected;
    request.token_ids.insert(request.token_ids.end(), output->sampled_token_ids.begin(),
                             output->sampled_token_ids.end());
    if (output->stopped) {
      finished.push_back(Finish(request, RequestStatus::kFinishedStopped));
    } else if (request.num_output_tokens() == request.max_tokens) {
      finished.push_back(Finish(request, RequestStatus::kFinishedLength));
    } else {
      request.draft_token_ids = output->draft_token_ids;
    }
  }
  MOE_CHECK(output_of.empty(), "output for request %lld, which the step did not schedule",
            static_cast<long long>(output_of.begin()->first));
  in_flight_.reset();
  return finished;
}

Status Scheduler::CheckInvariants() const {
  MOE_RETURN_IF_ERROR(kv_.CheckInvariants());
  if (num_running() > config_.max_num_seqs) return Status::Error("more running than max_num_seqs");
  if (kv_.num_requests() != num_running()) {
    return Status::Error("block tables for " + std::to_string(kv_.num_requests()) + " requests, " +
                         std::to_string(num_running()) + " running");
  }
  std::unordered_set<const Request*> seen;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Request& r = *running_[i];
    const std::string name = "running request " + std::to_string(r.id);
    if (!seen.insert(&r).second) return Status::Error(name + " queued twice");
    if (r.status != RequestStatus::kRunning) {
      return Status::Error(name + " has status " + RequestStatusName(r.status));
    }
    if (!kv_.has_request(r.id)) return Status::Error(name + " holds no blocks");
    const auto num_slots =
        static_cast<int64_t>(kv_.block_table(r.id).size()) * kv_.block_size();
    if (num_slots < r.num_computed_tokens) {
      return Status::Error(name + " has fewer slots than computed tokens");
    }
    if (r.num_computed_tokens >= r.num_tokens()) {
      return Status::Error(name + " has no token left to compute");
    }
    if (i > 0 && RunsBefore(r, *running_[i - 1])) return Status::Error(name + " out of order");
  }
  for (const Request* r : waiting_) {
    const std::string name = "waiting request " + std::to_string(r->id);
    if (!seen.insert(r).second) return Status::Error(name + " queued twice");
    if (r->status != RequestStatus::kWaiting && r->status != RequestStatus::kPreempted) {
      return Status::Error(name + " has status " + RequestStatusName(r->status));
    }
    if (kv_.has_request(r->id) || r->num_computed_tokens != 0) {
      return Status::Error(name + " holds KV");
    }
  }
  if (seen.size() != requests_.size()) return Status::Error("a request is in no queue");
  return Status::Ok();
}

}  // namespace moe
