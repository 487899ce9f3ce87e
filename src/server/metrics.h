// The serving metrics of one engine, in Prometheus' text format. Names follow vLLM's where vLLM
// has the metric (vllm:time_to_first_token_seconds -> moe:time_to_first_token_seconds, ...), so
// existing dashboards map over by prefix.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/expert_load.h"

namespace moe {

// A cumulative histogram with fixed upper bounds, as Prometheus expects.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Appends the _bucket, _sum and _count lines of `name`.
  void Render(const std::string& name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

struct EngineGauges {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  double kv_cache_usage = 0;  // fraction
  int64_t kv_capacity_tokens = 0;
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t num_preemptions = 0;
  double moe_exchange_seconds = 0;
};

class ServingMetrics {
 public:
  ServingMetrics();

  void ObserveTimeToFirstToken(double seconds) { ttft_.Observe(seconds); }
  void ObserveInterTokenLatency(double seconds) { itl_.Observe(seconds); }
  void ObserveEndToEnd(double seconds) { e2e_.Observe(seconds); }
  void AddPromptTokens(int64_t n) { prompt_tokens_ += n; }
  void AddGenerationTokens(int64_t n) { generation_tokens_ += n; }
  void CountFinished(const std::string& reason) { ++finished_[reason]; }
  // One engine step that took `seconds`: with the wall time, how busy the step loop is.
  void CountStep(double seconds) {
    ++steps_;
    step_seconds_ += seconds;
  }

  std::string Render(const EngineGauges& gauges, const std::vector<ExpertLoadCounter::LayerLoad>& expert_load) const;

 private:
  Histogram ttft_, itl_, e2e_;
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  std::map<std::string, int64_t> finished_;
  int64_t steps_ = 0;
  double step_seconds_ = 0;
};

}  // namespace moe
