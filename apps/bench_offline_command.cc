// bench-offline: synthetic requests through the engine in this process, at a fixed concurrency,
// reporting throughput and latency the way serving benchmarks do.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "apps/commands.h"
#include "engine/engine.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model = kDefaultModelDir;
  std::string dtype = "w8a8";
  int64_t num_requests = 64;
  int64_t input_len = 128;
  int64_t output_len = 64;
  double range_ratio = 0.0;  // lengths uniform in [len * (1 - r), len * (1 + r)]
  int64_t concurrency = 16;
  uint64_t seed = 0;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 64;
  double kv_cache_gib = 1.0;
  int32_t block_size = 16;
  bool json = false;
};

struct Timing {
  Clock::time_point submitted, first_token, last_token;
  int64_t outputs = 0;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::min<double>(v.size() - 1, std::floor(p / 100.0 * v.size())))];
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / v.size();
}

int Run(const BenchOptions& o) {
  auto dtype = ParseDType(o.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  auto model = DeepseekV3Model::Load(o.model, *dtype);
  if (!model.ok()) return Fail(model.status());
  const int64_t vocab = (*model)->config().vocab_size;

  EngineConfig config;
  config.block_size = o.block_size;
  config.kv_cache_memory_bytes = static_cast<int64_t>(o.kv_cache_gib * (1 << 30));
  config.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  config.scheduler.max_num_seqs = o.max_num_seqs;
  LocalExpertBackend experts;
  Engine engine(**model, experts, config);
  spdlog::info("KV cache: {} tokens", engine.kv_capacity_tokens());

  std::mt19937_64 rng(o.seed);
  auto length = [&](int64_t mean) {
    const int64_t lo = std::max<int64_t>(1, std::llround(mean * (1 - o.range_ratio)));
    const int64_t hi = std::max<int64_t>(lo, std::llround(mean * (1 + o.range_ratio)));
    return lo + static_cast<int64_t>(rng() % (hi - lo + 1));
  };
  std::vector<EngineRequest> requests;
  for (int64_t i = 0; i < o.num_requests; ++i) {
    EngineRequest r;
    r.id = i;
    r.prompt.resize(length(o.input_len));
    for (int32_t& t : r.prompt) t = static_cast<int32_t>(rng() % vocab);
    r.max_tokens = length(o.output_len);
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    requests.push_back(std::move(r));
  }

  std::unordered_map<RequestId, Timing> timings;
  size_t next = 0;
  int64_t in_flight = 0, prompt_tokens = 0, output_tokens = 0;
  const Clock::time_point start = Clock::now();
  while (next < requests.size() || engine.HasUnfinishedRequests()) {
    while (next < requests.size() && in_flight < o.concurrency) {
      prompt_tokens += static_cast<int64_t>(requests[next].prompt.size());
      timings[requests[next].id].submitted = Clock::now();
      if (Status s = engine.AddRequest(requests[next]); !s.ok()) return Fail(s);
      ++next;
      ++in_flight;
    }
    for (const RequestOutput& out : engine.Step()) {
      Timing& t = timings[out.id];
      const Clock::time_point now = Clock::now();
      if (t.outputs == 0 && !out.new_token_ids.empty()) t.first_token = now;
      t.outputs += static_cast<int64_t>(out.new_token_ids.size());
      output_tokens += static_cast<int64_t>(out.new_token_ids.size());
      t.last_token = now;
      if (out.finished) {
        --in_flight;
        if ((o.num_requests - next + in_flight) % 16 == 0) spdlog::info("{} requests left", o.num_requests - next + in_flight);
      }
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<double> ttft, tpot;
  for (const auto& [id, t] : timings) {
    ttft.push_back(std::chrono::duration<double, std::milli>(t.first_token - t.submitted).count());
    if (t.outputs > 1) {
      tpot.push_back(std::chrono::duration<double, std::milli>(t.last_token - t.first_token).count() / (t.outputs - 1));
    }
  }
  const nlohmann::json result = {
      {"requests", o.num_requests},           {"concurrency", o.concurrency},
      {"dtype", o.dtype},                      {"duration_s", seconds},
      {"prompt_tokens", prompt_tokens},        {"output_tokens", output_tokens},
      {"output_tokens_per_s", output_tokens / seconds},
      {"total_tokens_per_s", (prompt_tokens + output_tokens) / seconds},
      {"mean_ttft_ms", Mean(ttft)},            {"p99_ttft_ms", Percentile(ttft, 99)},
      {"mean_tpot_ms", Mean(tpot)},            {"p99_tpot_ms", Percentile(tpot, 99)},
      {"preemptions", engine.num_preemptions()}};
  if (o.json) {
    std::cout << result.dump() << "\n";
  } else {
    for (const auto& [key, value] : result.items()) std::cout << key << ": " << value << "\n";
  }
  return 0;
}

}  // namespace

CommandRunner AddBenchOfflineCommand(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench-offline",
                                     "run synthetic requests through the engine at a fixed concurrency and report "
                                     "throughput, TTFT and TPOT");
  cmd->add_option("--model", o->model, "checkpoint directory")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "f32, bf16 or w8a8")->capture_default_str();
  cmd->add_option("--num-requests", o->num_requests)->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--input-len", o->input_len, "prompt tokens (random ids)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "generated tokens")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--range-ratio", o->range_ratio, "lengths uniform within +- this fraction")->check(CLI::Range(0.0, 0.99));
  cmd->add_option("--concurrency", o->concurrency, "requests in flight")->check(CLI::Range(int64_t{1}, int64_t{1} << 16))->capture_default_str();
  cmd->add_option("--seed", o->seed);
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens)->check(CLI::Range(int64_t{1}, int64_t{1} << 24))->capture_default_str();
  cmd->add_option("--max-num-seqs", o->max_num_seqs)->check(CLI::Range(int64_t{1}, int64_t{1} << 16))->capture_default_str();
  cmd->add_option("--kv-cache-memory", o->kv_cache_gib, "GiB of latent cache")->check(CLI::Range(0.001, 4096.0))->capture_default_str();
  cmd->add_option("--block-size", o->block_size, "tokens per cache block")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_flag("--json", o->json, "print one JSON object");
  return [o] { return Run(*o); };
}

}  // namespace moe
