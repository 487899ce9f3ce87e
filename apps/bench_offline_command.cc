// bench-offline: synthetic requests through the engine in this process, at a fixed concurrency,
// reporting throughput and latency the way serving benchmarks do. With --runs FILE it loads the
// model once and runs a list of such benchmarks, each on a fresh engine (bench/e2e.py uses it).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>

#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "apps/bench_stats.h"
#include "apps/commands.h"
#include "engine/engine.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

// CPU seconds of every thread of this process: on a machine shared with other work, the time a
// run was given, next to the wall time it took.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

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
  std::string runs_file;  // JSON array of runs overriding the workload fields below
  std::string name;       // of the run, echoed in its result
  int64_t repeat = 1;     // times to run it
  std::string pause_file;  // before each run, wait while this file exists
};

// A run of --runs FILE: `defaults` with the fields the object names replaced.
Expected<BenchOptions> ParseRun(const nlohmann::json& j, const BenchOptions& defaults) {
  if (!j.is_object()) return Status::Error("each run must be a JSON object");
  BenchOptions o = defaults;
  try {
    for (const auto& [key, value] : j.items()) {
      if (key == "name") o.name = value.get<std::string>();
      else if (key == "num_requests") o.num_requests = value.get<int64_t>();
      else if (key == "input_len") o.input_len = value.get<int64_t>();
      else if (key == "output_len") o.output_len = value.get<int64_t>();
      else if (key == "range_ratio") o.range_ratio = value.get<double>();
      else if (key == "concurrency") o.concurrency = value.get<int64_t>();
      else if (key == "seed") o.seed = value.get<uint64_t>();
      else if (key == "max_num_batched_tokens") o.max_num_batched_tokens = value.get<int64_t>();
      else if (key == "max_num_seqs") o.max_num_seqs = value.get<int64_t>();
      else if (key == "repeat") o.repeat = value.get<int64_t>();
      else return Status::Error("unknown field '" + key + "' in a run");
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(std::string("bad value in a run: ") + e.what());
  }
  if (o.num_requests < 1 || o.input_len < 1 || o.output_len < 1 || o.concurrency < 1 || o.repeat < 1 ||
      o.max_num_batched_tokens < 1 || o.max_num_seqs < 1 || o.range_ratio < 0 || o.range_ratio > 0.99) {
    return Status::Error("run '" + o.name + "': counts must be >= 1 and range_ratio in [0, 0.99]");
  }
  return o;
}

Expected<std::vector<BenchOptions>> ReadRuns(const BenchOptions& defaults) {
  std::ifstream in(defaults.runs_file);
  if (!in) return Status::Error("cannot open --runs file " + defaults.runs_file);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return Status::Error(defaults.runs_file + ": expected a JSON array of runs");
  std::vector<BenchOptions> runs;
  for (const nlohmann::json& run : j) {
    auto o = ParseRun(run, defaults);
    if (!o.ok()) return Status::Error(defaults.runs_file + ": " + o.status().message());
    runs.push_back(std::move(o).value());
  }
  return runs;
}

struct Timing {
  Clock::time_point submitted, first_token, last_token;
  int64_t outputs = 0;
};

// One benchmark on a fresh engine (so no prefix-cache hits carry over from an earlier run).
Expected<nlohmann::json> RunOnce(const DeepseekV3Model& model, const BenchOptions& o) {
  const int64_t vocab = model.config().vocab_size;

  EngineConfig config;
  config.block_size = o.block_size;
  config.kv_cache_memory_bytes = static_cast<int64_t>(o.kv_cache_gib * (1 << 30));
  config.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  config.scheduler.max_num_seqs = o.max_num_seqs;
  LocalExpertBackend experts;
  Engine engine(model, experts, config);
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
  // Decode-only steps: those that emitted tokens, none of them a request's first (so no prompt
  // was computed in them, as long as prompts fit the token budget whole). Their tokens over
  // their time is the decode throughput without the prefill the end-to-end figures include.
  int64_t decode_steps = 0, decode_tokens = 0;
  double decode_seconds = 0, decode_cpu_seconds = 0;
  std::vector<double> decode_step_ms;
  Clock::time_point first_decode{}, last_decode{};
  const Clock::time_point start = Clock::now();
  const double start_cpu = ProcessCpuSeconds();
  while (next < requests.size() || engine.HasUnfinishedRequests()) {
    while (next < requests.size() && in_flight < o.concurrency) {
      prompt_tokens += static_cast<int64_t>(requests[next].prompt.size());
      timings[requests[next].id].submitted = Clock::now();
      if (Status s = engine.AddRequest(requests[next]); !s.ok()) return s;
      ++next;
      ++in_flight;
    }
    const Clock::time_point step_start = Clock::now();
    const double step_start_cpu = ProcessCpuSeconds();
    const std::vector<RequestOutput> outputs = engine.Step();
    const Clock::time_point now = Clock::now();
    const double step_cpu = ProcessCpuSeconds() - step_start_cpu;
    int64_t step_tokens = 0;
    bool any_first = false;
    for (const RequestOutput& out : outputs) {
      Timing& t = timings[out.id];
      if (t.outputs == 0 && !out.new_token_ids.empty()) {
        t.first_token = now;
        any_first = true;
      }
      t.outputs += static_cast<int64_t>(out.new_token_ids.size());
      step_tokens += static_cast<int64_t>(out.new_token_ids.size());
      t.last_token = now;
      if (out.finished) {
        --in_flight;
        if ((o.num_requests - next + in_flight) % 16 == 0) spdlog::info("{} requests left", o.num_requests - next + in_flight);
      }
    }
    output_tokens += step_tokens;
    if (step_tokens > 0 && !any_first) {
      const double ms = std::chrono::duration<double, std::milli>(now - step_start).count();
      ++decode_steps;
      decode_tokens += step_tokens;
      decode_seconds += ms / 1000;
      decode_cpu_seconds += step_cpu;
      decode_step_ms.push_back(ms);
      if (decode_steps == 1) first_decode = step_start;
      last_decode = now;
    }
  }
  const Clock::time_point end = Clock::now();
  const double seconds = std::chrono::duration<double>(end - start).count();
  const double cpu_seconds = ProcessCpuSeconds() - start_cpu;

  std::vector<double> ttft, tpot;
  for (const auto& [id, t] : timings) {
    ttft.push_back(std::chrono::duration<double, std::milli>(t.first_token - t.submitted).count());
    if (t.outputs > 1) {
      tpot.push_back(std::chrono::duration<double, std::milli>(t.last_token - t.first_token).count() / (t.outputs - 1));
    }
  }
  nlohmann::json result = {
      {"requests", o.num_requests},           {"concurrency", o.concurrency},
      {"input_len", o.input_len},              {"output_len", o.output_len},
      {"dtype", o.dtype},                      {"duration_s", seconds},
      {"prompt_tokens", prompt_tokens},        {"output_tokens", output_tokens},
      {"output_tokens_per_s", output_tokens / seconds},
      {"total_tokens_per_s", (prompt_tokens + output_tokens) / seconds},
      {"mean_ttft_ms", Mean(ttft)},            {"p99_ttft_ms", Percentile(ttft, 99)},
      {"mean_tpot_ms", Mean(tpot)},            {"p99_tpot_ms", Percentile(tpot, 99)},
      {"preemptions", engine.num_preemptions()},
      {"decode_steps", decode_steps},
      {"decode_tokens_per_s", decode_seconds > 0 ? decode_tokens / decode_seconds : 0.0},
      {"mean_decode_step_ms", Mean(decode_step_ms)},
      {"median_decode_step_ms", Percentile(decode_step_ms, 50)},
      {"cpu_s", cpu_seconds},
      {"decode_cpu_s", decode_cpu_seconds},
      // steady_clock is CLOCK_MONOTONIC: `perf record -k CLOCK_MONOTONIC` then
      // `perf report --time <first>,<last>` profiles the whole run or its decode steps alone.
      {"window_monotonic_s",
       {std::chrono::duration<double>(start.time_since_epoch()).count(),
        std::chrono::duration<double>(end.time_since_epoch()).count()}},
      {"decode_window_monotonic_s",
       {std::chrono::duration<double>(first_decode.time_since_epoch()).count(),
        std::chrono::duration<double>(last_decode.time_since_epoch()).count()}}};
  if (!o.name.empty()) result["name"] = o.name;
  return result;
}

int Run(const BenchOptions& defaults) {
  std::vector<BenchOptions> runs{defaults};
  if (!defaults.runs_file.empty()) {
    auto parsed = ReadRuns(defaults);
    if (!parsed.ok()) return Fail(parsed.status());
    runs = std::move(parsed).value();
  }
  auto dtype = ParseDType(defaults.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  const Clock::time_point load_start = Clock::now();
  auto model = DeepseekV3Model::Load(defaults.model, *dtype);
  if (!model.ok()) return Fail(model.status());
  const double load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();
  spdlog::info("model loaded in {:.1f} s", load_seconds);

  for (const BenchOptions& o : runs) {
    for (int64_t rep = 0; rep < o.repeat; ++rep) {
      // A driver on a shared machine holds runs back while other work is busy (bench/e2e.py).
      struct stat st{};
      double paused_s = 0;
      while (!defaults.pause_file.empty() && stat(defaults.pause_file.c_str(), &st) == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        paused_s += 0.5;
      }
      auto result = RunOnce(**model, o);
      if (!result.ok()) return Fail(result.status());
      (*result)["load_s"] = load_seconds;
      if (o.repeat > 1) (*result)["repetition"] = rep;
      if (!defaults.pause_file.empty()) (*result)["paused_before_s"] = paused_s;
      if (defaults.json) {
        std::cout << result->dump() << std::endl;
      } else {
        for (const auto& [key, value] : result->items()) std::cout << key << ": " << value << "\n";
        std::cout << std::endl;
      }
    }
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
  cmd->add_flag("--json", o->json, "print one JSON object (a line per run)");
  cmd->add_option("--runs", o->runs_file,
                  "JSON array of runs, each an object of the workload fields to change (num_requests, input_len, "
                  "output_len, concurrency, range_ratio, seed, max_num_batched_tokens, max_num_seqs) plus name and "
                  "repeat; the model is loaded once")
      ->check(CLI::ExistingFile);
  cmd->add_option("--pause-file", o->pause_file,
                  "before each run, wait while this file exists (lets a driver hold runs back while the machine is "
                  "busy with other work)");
  return [o] { return Run(*o); };
}

}  // namespace moe
