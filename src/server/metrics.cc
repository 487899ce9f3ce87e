#include "server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace moe {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, std::string& out) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

ServingMetrics::ServingMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      itl_({0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 10}),
      e2e_({0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960}) {}

std::string ServingMetrics::Render(const EngineGauges& g,
                                   const std::vector<ExpertLoadCounter::LayerLoad>& expert_load) const {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto scalar = [&](const char* name, const char* type, const char* help, auto value) {
    metric(name, type, help);
    out += fmt::format("{} {}\n", name, value);
  };
  scalar("moe:num_requests_running", "gauge", "Requests in the running batch.", g.num_running);
  scalar("moe:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", g.num_waiting);
  scalar("moe:kv_cache_usage_perc", "gauge", "Fraction of latent-cache blocks in use (1 = full).", g.kv_cache_usage);
  scalar("moe:kv_cache_capacity_tokens", "gauge", "Tokens the latent cache holds.", g.kv_capacity_tokens);
  scalar("moe:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
         g.prefix_queried_tokens);
  scalar("moe:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", g.prefix_hit_tokens);
  scalar("moe:num_preemptions_total", "counter", "Requests preempted for lack of cache blocks.", g.num_preemptions);
  scalar("moe:prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", prompt_tokens_);
  scalar("moe:generation_tokens_total", "counter", "Generated tokens.", generation_tokens_);
  scalar("moe:engine_steps_total", "counter", "Engine steps run.", steps_);
  scalar("moe:engine_step_seconds_total", "counter",
         "Time the engine loop spent in steps; the rest of the wall time it waited for work or did I/O.",
         step_seconds_);
  scalar("moe:moe_exchange_seconds_total", "counter",
         "Time the MoE layers spent moving tokens between ranks, waiting for the other ranks included: "
         "over moe:engine_step_seconds_total, the communication share of the steps.",
         g.moe_exchange_seconds);
  metric("moe:request_success_total", "counter", "Finished requests by finish reason.");
  for (const auto& [reason, count] : finished_) {
    out += fmt::format("moe:request_success_total{{finished_reason=\"{}\"}} {}\n", reason, count);
  }
  metric("moe:time_to_first_token_seconds", "histogram", "From arrival at the engine to the first token.");
  ttft_.Render("moe:time_to_first_token_seconds", out);
  metric("moe:inter_token_latency_seconds", "histogram", "Between consecutive tokens of a request.");
  itl_.Render("moe:inter_token_latency_seconds", out);
  metric("moe:e2e_request_latency_seconds", "histogram", "From arrival at the engine to the last token.");
  e2e_.Render("moe:e2e_request_latency_seconds", out);
  metric("moe:expert_tokens_total", "counter", "Tokens routed to each expert of each MoE layer.");
  for (const auto& layer : expert_load) {
    for (size_t e = 0; e < layer.tokens_per_expert.size(); ++e) {
      out += fmt::format("moe:expert_tokens_total{{layer=\"{}\",expert=\"{}\"}} {}\n", layer.layer, e,
                         layer.tokens_per_expert[e]);
    }
  }
  // Max over mean: 1 is perfectly balanced; expert parallelism runs at the pace of the busiest.
  metric("moe:expert_load_imbalance", "gauge", "Max over mean tokens per expert, per MoE layer.");
  for (const auto& layer : expert_load) {
    int64_t total = 0, most = 0;
    for (int64_t n : layer.tokens_per_expert) {
      total += n;
      most = std::max(most, n);
    }
    const double mean = static_cast<double>(total) / std::max<size_t>(1, layer.tokens_per_expert.size());
    out += fmt::format("moe:expert_load_imbalance{{layer=\"{}\"}} {}\n", layer.layer, mean > 0 ? most / mean : 1.0);
  }
  return out;
}

}  // namespace moe
