// bench-serve: a client that loads a running OpenAI-compatible server (`moe-serve serve`, or vLLM,
// SGLang, ...) and measures it the way `vllm bench serve` does: random token-id prompts of exact
// lengths with ignore_eos, sent at a Poisson rate or a fixed concurrency over streaming
// /v1/completions; TTFT, TPOT, ITL and E2E latency, throughput, goodput under SLOs. With
// --sweep-concurrency it runs the seed's decode methodology: the highest throughput whose mean
// TPOT stays within a limit.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/bench_stats.h"
#include "apps/commands.h"
#include "apps/completions_client.h"
#include "base/termination.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Beyond this many requests in flight at once, threads (one per connection) get expensive.
constexpr int64_t kMaxInFlight = 4096;

struct BenchServeOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string api_key;
  std::string model;  // default: the first of GET /v1/models
  int64_t num_prompts = 100;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;
  uint64_t seed = 0;
  int64_t vocab_size = 4096;
  double request_rate = std::numeric_limits<double>::infinity();
  int64_t max_concurrency = 0;  // 0: no limit
  std::optional<double> slo_ttft_ms, slo_tpot_ms, slo_e2el_ms;
  int64_t num_cards = 1;
  std::string result_json;
  std::string preset;
  std::vector<int64_t> sweep_concurrency;
  double tpot_limit_ms = 100;
  int64_t prompts_per_concurrency = 4;
  double timeout_s = 3600;
  bool no_progress = false;
  bool num_prompts_given = false;  // set after parsing
};

// Lengths uniform in [len * (1 - r), len * (1 + r)], as vLLM's random dataset draws them.
std::pair<int64_t, int64_t> LengthRange(int64_t len, double ratio) {
  const int64_t lo = std::max<int64_t>(1, std::llround(static_cast<double>(len) * (1 - ratio)));
  const int64_t hi = std::max<int64_t>(lo, std::llround(static_cast<double>(len) * (1 + ratio)));
  return {lo, hi};
}

std::vector<RequestSpec> MakeRequests(const BenchServeOptions& o, int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto draw = [&](int64_t len) {
    const auto [lo, hi] = LengthRange(len, o.range_ratio);
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(o.vocab_size - 1));
  std::vector<RequestSpec> requests(count);
  for (RequestSpec& r : requests) {
    r.prompt.resize(draw(o.input_len));
    for (int32_t& t : r.prompt) t = token(rng);
    r.output_len = draw(o.output_len);
  }
  return requests;
}

// One benchmark run: a request list sent at a rate and a concurrency.
struct RunSpec {
  std::string name;
  int64_t num_prompts = 0;
  int64_t max_concurrency = 0;  // 0: no limit
  uint64_t seed = 0;
};

std::string FormatRate(double rate) { return std::isinf(rate) ? "inf" : fmt::format("{}", rate); }

std::string NowIso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

class Progress {
 public:
  Progress(int64_t total, bool enabled) : total_(total), enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0) {}

  std::atomic<int64_t> done{0}, failed{0}, in_flight{0};

  // Prints a line now and then until `finished`.
  void Run(const std::atomic<bool>& finished, const std::string& label) {
    const Clock::time_point start = Clock::now();
    Clock::time_point last_print = start;
    while (!finished.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const auto now = Clock::now();
      if (enabled_ && now - last_print >= (tty_ ? std::chrono::milliseconds(200) : std::chrono::seconds(5))) {
        Print(label, std::chrono::duration<double>(now - start).count(), false);
        last_print = now;
      }
    }
    if (enabled_) Print(label, std::chrono::duration<double>(Clock::now() - start).count(), true);
  }

 private:
  void Print(const std::string& label, double seconds, bool last) {
    const std::string line = fmt::format("bench-serve{}: {}/{} done, {} failed, {} in flight, {:.1f} s", label,
                                         done.load(), total_, failed.load(), in_flight.load(), seconds);
    if (tty_) {
      std::cerr << "\r" << line << "\033[K" << (last ? "\n" : "") << std::flush;
    } else {
      std::cerr << line << "\n" << std::flush;
    }
  }

  const int64_t total_;
  const bool enabled_;
  const bool tty_;
};

struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
};

json Distribution(const std::string& name, const std::vector<double>& seconds) {
  std::vector<double> ms;
  ms.reserve(seconds.size());
  for (double s : seconds) ms.push_back(s * 1000);
  return {{"mean_" + name + "_ms", Mean(ms)},
          {"median_" + name + "_ms", Percentile(ms, 50)},
          {"std_" + name + "_ms", StdDev(ms)},
          {"p90_" + name + "_ms", Percentile(ms, 90)},
          {"p99_" + name + "_ms", Percentile(ms, 99)}};
}

// Everything a run measured, in vLLM's result names where vLLM has one.
json Summarize(const BenchServeOptions& o, const RunSpec& run, const ServedModel& model,
               const std::vector<RequestResult>& results, double duration_s, double started_at) {
  int64_t completed = 0, failed = 0, input_tokens = 0, output_tokens = 0, good = 0;
  std::string first_error;
  std::map<std::string, int64_t> error_counts;
  std::vector<double> ttft, tpot, itl, e2el;
  json per_request = json::array();
  for (const RequestResult& r : results) {
    json row = {{"input_len", r.prompt_len}, {"output_len", r.output_tokens}};
    if (!r.success) {
      ++failed;
      if (first_error.empty()) first_error = r.error;
      ++error_counts[r.error.substr(0, 200)];
      row["error"] = r.error;
      per_request.push_back(std::move(row));
      continue;
    }
    ++completed;
    input_tokens += r.prompt_len;
    output_tokens += r.output_tokens;
    // A request of one token has no time per output token; it meets any TPOT SLO (as in vLLM).
    const double request_tpot = r.output_tokens > 1 ? (r.e2el_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1) : 0;
    ttft.push_back(r.ttft_s);
    e2el.push_back(r.e2el_s);
    if (r.output_tokens > 1) tpot.push_back(request_tpot);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    const bool meets = (!o.slo_ttft_ms || r.ttft_s * 1000 <= *o.slo_ttft_ms) &&
                       (!o.slo_tpot_ms || request_tpot * 1000 <= *o.slo_tpot_ms) &&
                       (!o.slo_e2el_ms || r.e2el_s * 1000 <= *o.slo_e2el_ms);
    good += meets;
    row["ttft_ms"] = r.ttft_s * 1000;
    row["tpot_ms"] = request_tpot * 1000;
    row["e2el_ms"] = r.e2el_s * 1000;
    row["chunks"] = static_cast<int64_t>(r.itl_s.size()) + 1;
    per_request.push_back(std::move(row));
  }
  const double d = std::max(duration_s, 1e-9);
  const double output_throughput = static_cast<double>(output_tokens) / d;
  const double total_throughput = static_cast<double>(input_tokens + output_tokens) / d;
  json slo = json::object();
  if (o.slo_ttft_ms) slo["ttft_ms"] = *o.slo_ttft_ms;
  if (o.slo_tpot_ms) slo["tpot_ms"] = *o.slo_tpot_ms;
  if (o.slo_e2el_ms) slo["e2el_ms"] = *o.slo_e2el_ms;
  json errors = json::object();
  for (const auto& [message, count] : error_counts) errors[message] = count;

  json out = {{"date", NowIso8601()},
              {"base_url", o.base_url},
              {"model_id", model.id},
              {"preset", o.preset.empty() ? json(nullptr) : json(o.preset)},
              {"num_prompts", run.num_prompts},
              {"input_len", o.input_len},
              {"output_len", o.output_len},
              {"range_ratio", o.range_ratio},
              {"seed", run.seed},
              {"request_rate", FormatRate(o.request_rate)},
              {"max_concurrency", run.max_concurrency > 0 ? json(run.max_concurrency) : json(nullptr)},
              {"num_cards", o.num_cards},
              {"duration", duration_s},
              // Unix time of the first request, to line the run up with the server's own records.
              {"started_at", started_at},
              {"completed", completed},
              {"failed", failed},
              {"first_error", first_error.empty() ? json(nullptr) : json(first_error)},
              {"error_counts", std::move(errors)},
              {"total_input_tokens", input_tokens},
              {"total_output_tokens", output_tokens},
              {"request_throughput", static_cast<double>(completed) / d},
              {"output_throughput", output_throughput},
              {"total_token_throughput", total_throughput},
              {"output_throughput_per_card", output_throughput / static_cast<double>(o.num_cards)},
              {"total_token_throughput_per_card", total_throughput / static_cast<double>(o.num_cards)},
              {"slo", std::move(slo)},
              {"good_requests", o.slo_ttft_ms || o.slo_tpot_ms || o.slo_e2el_ms ? json(good) : json(nullptr)},
              {"request_goodput",
               o.slo_ttft_ms || o.slo_tpot_ms || o.slo_e2el_ms ? json(static_cast<double>(good) / d) : json(nullptr)}};
  for (const auto& [name, values] :
       {std::pair<const char*, const std::vector<double>*>{"ttft", &ttft}, {"tpot", &tpot}, {"itl", &itl},
        {"e2el", &e2el}}) {
    out.update(Distribution(name, *values));
  }
  out["requests"] = std::move(per_request);
  return out;
}

void PrintReport(const json& r, std::ostream& os) {
  auto line = [&](const std::string& label, const std::string& value) { os << fmt::format("{:<44}{}\n", label, value); };
  auto num = [&](const char* key, int digits) {
    const json& v = r[key];
    return v.is_null() ? std::string("-") : fmt::format("{:.{}f}", v.get<double>(), digits);
  };
  os << fmt::format("{:=^60}\n", " Serving Benchmark Result ");
  line("Successful requests:", std::to_string(r["completed"].get<int64_t>()));
  line("Failed requests:", std::to_string(r["failed"].get<int64_t>()));
  if (!r["first_error"].is_null()) line("First error:", r["first_error"].get<std::string>());
  line("Maximum request concurrency:", r["max_concurrency"].is_null() ? "none" : r["max_concurrency"].dump());
  line("Request rate (req/s):", r["request_rate"].get<std::string>());
  line("Benchmark duration (s):", num("duration", 2));
  line("Total input tokens:", std::to_string(r["total_input_tokens"].get<int64_t>()));
  line("Total generated tokens:", std::to_string(r["total_output_tokens"].get<int64_t>()));
  line("Request throughput (req/s):", num("request_throughput", 2));
  if (!r["request_goodput"].is_null()) line("Request goodput (req/s):", num("request_goodput", 2));
  line("Output token throughput (tok/s):", num("output_throughput", 2));
  line("Total token throughput (tok/s):", num("total_token_throughput", 2));
  line(fmt::format("Output tok/s per card ({} cards):", r["num_cards"].get<int64_t>()),
       num("output_throughput_per_card", 2));
  for (const auto& [name, title] : {std::pair<std::string, std::string>{"ttft", "Time to First Token"},
                                    {"tpot", "Time per Output Token (excl. 1st token)"},
                                    {"itl", "Inter-token Latency"},
                                    {"e2el", "End-to-end Latency"}}) {
    os << fmt::format("{:-^60}\n", " " + title + " ");
    const std::string upper = name == "e2el" ? "E2EL" : name == "ttft" ? "TTFT" : name == "tpot" ? "TPOT" : "ITL";
    line("Mean " + upper + " (ms):", num(("mean_" + name + "_ms").c_str(), 2));
    line("Median " + upper + " (ms):", num(("median_" + name + "_ms").c_str(), 2));
    line("P90 " + upper + " (ms):", num(("p90_" + name + "_ms").c_str(), 2));
    line("P99 " + upper + " (ms):", num(("p99_" + name + "_ms").c_str(), 2));
  }
  os << std::string(60, '=') << "\n" << std::flush;
}

class Benchmark {
 public:
  Benchmark(const BenchServeOptions& o, BaseUrl url, ServedModel model)
      : o_(o),
        url_(std::move(url)),
        settings_{o.api_key, o.timeout_s},
        model_(std::move(model)),
        path_(url_.prefix + "/v1/completions") {}

  // One request before the run, as vLLM sends: a bad model name, key or length fails here,
  // with the server's own words, rather than as N identical failures.
  Status Probe() {
    BenchServeOptions probe_options = o_;
    probe_options.range_ratio = 0;
    // Its own prompt (another seed), so that no request of the run finds it in the prefix cache.
    RequestSpec spec = MakeRequests(probe_options, 1, o_.seed ^ 0x9E3779B97F4A7C15ull).front();
    spec.output_len = 1;
    auto client = MakeClient(url_, settings_);
    const RequestResult r = SendRequest(*client, path_, model_.id, spec);
    if (!r.success) return Status::Error("the test request to " + o_.base_url + path_ + " failed: " + r.error);
    return Status::Ok();
  }

  json Run(const RunSpec& run) {
    const std::vector<RequestSpec> requests = MakeRequests(o_, run.num_prompts, run.seed);
    // Arrival offsets: a Poisson process of the request rate (all at once when infinite).
    std::vector<double> arrival(requests.size(), 0.0);
    if (!std::isinf(o_.request_rate)) {
      std::mt19937_64 rng(run.seed + 1);
      std::exponential_distribution<double> gap(o_.request_rate);
      double t = 0;
      for (double& a : arrival) {
        a = t;
        t += gap(rng);
      }
    }
    const int64_t workers =
        std::min<int64_t>(run.num_prompts, run.max_concurrency > 0 ? run.max_concurrency : run.num_prompts);
    std::vector<RequestResult> results(requests.size());
    std::atomic<size_t> next{0};
    std::atomic<bool> finished{false};
    Progress progress(run.num_prompts, !o_.no_progress);
    const double started_at =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const Clock::time_point start = Clock::now();
    std::vector<std::thread> threads;
    threads.reserve(workers);
    for (int64_t w = 0; w < workers; ++w) {
      threads.emplace_back([&] {
        auto client = MakeClient(url_, settings_);
        for (size_t i; (i = next.fetch_add(1)) < requests.size();) {
          std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(arrival[i])));
          ++progress.in_flight;
          results[i] = SendRequest(*client, path_, model_.id, requests[i]);
          --progress.in_flight;
          if (!results[i].success) ++progress.failed;
          ++progress.done;
        }
      });
    }
    std::thread monitor([&] { progress.Run(finished, run.name.empty() ? "" : " [" + run.name + "]"); });
    for (std::thread& t : threads) t.join();
    const double duration = std::chrono::duration<double>(Clock::now() - start).count();
    finished = true;
    monitor.join();
    return Summarize(o_, run, model_, results, duration, started_at);
  }

 private:
  const BenchServeOptions& o_;
  const BaseUrl url_;
  const ClientSettings settings_;
  const ServedModel model_;
  const std::string path_;
};

Status WriteJson(const std::string& file, const json& j) {
  std::ofstream out(file);
  if (!out) return Status::Error("--result-json: cannot write '" + file + "'");
  out << j.dump(2) << "\n";
  if (!out) return Status::Error("--result-json: cannot write '" + file + "'");
  return Status::Ok();
}

// SIGINT and SIGTERM are blocked in every thread (main.cc); this one waits for them and ends the
// process, whatever the requests in flight are doing (their connections close, so the server
// aborts them).
class InterruptWatcher {
 public:
  InterruptWatcher()
      : thread_([this] {
          while (!stop_.load()) {
            if (const int signal = WaitForTermination(std::chrono::milliseconds(200)); signal != 0) {
              std::cerr << (isatty(STDERR_FILENO) ? "\n" : "") << "error: interrupted by signal " << signal << "\n"
                        << std::flush;
              std::_Exit(128 + signal);
            }
          }
        }) {}
  ~InterruptWatcher() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The exit code of a finished run: 1, with one line, when any request failed (the report and the
// JSON result are written either way).
int FailedRequests(int64_t failed, int64_t total, const json& first_error) {
  if (failed == 0) return 0;
  return Fail(Status::Error(fmt::format("{} of {} requests failed; the first: {}", failed, total,
                                        first_error.is_string() ? first_error.get<std::string>() : "?")));
}

int RunBenchServe(BenchServeOptions o) {
  const InterruptWatcher watcher;
  if (o.preset == "decode-2k2k") {
    o.input_len = 2048;
    o.output_len = 2048;
  } else if (o.preset == "decode-1k2k") {
    o.input_len = 1024;
    o.output_len = 2048;
  }
  if (o.sweep_concurrency.empty() && o.max_concurrency == 0 && o.num_prompts > kMaxInFlight) {
    return Fail(Status::Error(fmt::format(
        "--num-prompts {} without --max-concurrency: a request in flight takes a thread here, and {} is the most; "
        "set --max-concurrency",
        o.num_prompts, kMaxInFlight)));
  }
  auto url = ParseBaseUrl(o.base_url);
  if (!url.ok()) return Fail(Status::Error("--base-url: " + url.status().message()));
  auto model = QueryModel(*url, {o.api_key, o.timeout_s}, o.model);
  if (!model.ok()) return Fail(model.status());
  const int64_t longest = LengthRange(o.input_len, o.range_ratio).second + LengthRange(o.output_len, o.range_ratio).second;
  if (model->max_model_len > 0 && longest > model->max_model_len) {
    return Fail(Status::Error(fmt::format(
        "prompt + output can reach {} tokens (--input-len {}, --output-len {}, --range-ratio {}), more than "
        "'{}' allows (max_model_len {})",
        longest, o.input_len, o.output_len, o.range_ratio, model->id, model->max_model_len)));
  }
  Benchmark bench(o, *url, *model);
  if (Status s = bench.Probe(); !s.ok()) return Fail(s);

  if (o.sweep_concurrency.empty()) {
    const RunSpec run{"", o.num_prompts, o.max_concurrency, o.seed};
    const json result = bench.Run(run);
    PrintReport(result, std::cout);
    if (!o.result_json.empty()) {
      if (Status s = WriteJson(o.result_json, result); !s.ok()) return Fail(s);
    }
    return FailedRequests(result["failed"].get<int64_t>(), run.num_prompts, result["first_error"]);
  }

  // The seed's decode methodology: each concurrency in turn; the best is the highest output
  // throughput whose mean TPOT is within the limit.
  json runs = json::array();
  std::optional<size_t> best;
  int64_t failed = 0, sent = 0;
  json first_error = nullptr;
  for (size_t i = 0; i < o.sweep_concurrency.size(); ++i) {
    const int64_t c = o.sweep_concurrency[i];
    const int64_t n = o.num_prompts_given ? o.num_prompts : std::max<int64_t>(c * o.prompts_per_concurrency, 16);
    // A seed per run, so that no run finds an earlier run's prompts in the prefix cache.
    const RunSpec run{"concurrency " + std::to_string(c), n, c, o.seed + 1000003 * i};
    json result = bench.Run(run);
    const bool meets = result["completed"].get<int64_t>() > 0 && result["failed"].get<int64_t>() == 0 &&
                       result["mean_tpot_ms"].get<double>() <= o.tpot_limit_ms;
    result["meets_tpot_limit"] = meets;
    failed += result["failed"].get<int64_t>();
    sent += n;
    if (first_error.is_null()) first_error = result["first_error"];
    std::cout << "\nconcurrency " << c << ":\n";
    PrintReport(result, std::cout);
    if (meets && (!best || result["output_throughput"].get<double>() > runs[*best]["output_throughput"].get<double>())) {
      best = i;
    }
    runs.push_back(std::move(result));
  }
  std::cout << fmt::format("\n{:=^78}\n", fmt::format(" Concurrency sweep: mean TPOT limit {} ms ", o.tpot_limit_ms));
  std::cout << fmt::format("{:>11} {:>9} {:>12} {:>13} {:>10} {:>10} {:>10} {:>6}\n", "concurrency", "req/s",
                           "output tok/s", "tok/s/card", "mean TPOT", "p99 TPOT", "mean TTFT", "meets");
  for (const json& r : runs) {
    std::cout << fmt::format("{:>11} {:>9.2f} {:>12.1f} {:>13.1f} {:>10.2f} {:>10.2f} {:>10.1f} {:>6}\n",
                             r["max_concurrency"].get<int64_t>(), r["request_throughput"].get<double>(),
                             r["output_throughput"].get<double>(), r["output_throughput_per_card"].get<double>(),
                             r["mean_tpot_ms"].get<double>(), r["p99_tpot_ms"].get<double>(),
                             r["mean_ttft_ms"].get<double>(), r["meets_tpot_limit"].get<bool>() ? "yes" : "no");
  }
  json best_json = nullptr;
  if (best) {
    const json& r = runs[*best];
    best_json = {{"max_concurrency", r["max_concurrency"]},
                 {"output_throughput", r["output_throughput"]},
                 {"output_throughput_per_card", r["output_throughput_per_card"]},
                 {"request_throughput", r["request_throughput"]},
                 {"mean_tpot_ms", r["mean_tpot_ms"]}};
    std::cout << fmt::format(
        "best within the limit: concurrency {}, {:.1f} output tok/s ({:.1f} per card), mean TPOT {:.2f} ms\n",
        r["max_concurrency"].get<int64_t>(), r["output_throughput"].get<double>(),
        r["output_throughput_per_card"].get<double>(), r["mean_tpot_ms"].get<double>());
  } else {
    std::cout << fmt::format("no concurrency met the limit: mean TPOT <= {} ms with no failed request\n",
                             o.tpot_limit_ms);
  }
  std::cout << std::flush;
  if (!o.result_json.empty()) {
    const json out = {{"tpot_limit_ms", o.tpot_limit_ms},
                      {"tpot_statistic", "mean"},
                      {"best", std::move(best_json)},
                      {"runs", std::move(runs)}};
    if (Status s = WriteJson(o.result_json, out); !s.ok()) return Fail(s);
  }
  return FailedRequests(failed, sent, first_error);
}

// A number > 0 ("inf" too where `allow_inf`); CLI11's PositiveNumber prints DBL_MAX as its range.
CLI::Validator Positive(bool allow_inf = false) {
  return CLI::Validator(
      [allow_inf](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || std::isnan(v) || !(v > 0) || (std::isinf(v) && !allow_inf)) {
          return "'" + text + "' is not a positive number" + (allow_inf ? " or inf" : "");
        }
        return "";
      },
      allow_inf ? "POSITIVE|inf" : "POSITIVE");
}

}  // namespace

CommandRunner AddBenchServeCommand(CLI::App& app) {
  auto o = std::make_shared<BenchServeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench-serve",
      "load a running OpenAI-compatible server with random-token prompts over streaming /v1/completions and "
      "report TTFT, TPOT, ITL, E2E latency, throughput and goodput (like `vllm bench serve`)");
  cmd->add_option("--base-url", o->base_url, "the server, http://HOST:PORT")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& url) {
            auto parsed = ParseBaseUrl(url);
            return parsed.ok() ? std::string() : parsed.status().message();
          },
          "URL"));
  cmd->add_option("--api-key", o->api_key, "sent as 'Authorization: Bearer KEY'");
  cmd->add_option("--model", o->model, "model name in requests (default: the first of GET /v1/models)");
  CLI::Option* num_prompts = cmd->add_option("--num-prompts", o->num_prompts, "requests to send")
                                 ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
                                 ->capture_default_str();
  CLI::Option* input_len = cmd->add_option("--input-len", o->input_len, "prompt tokens (random ids)")
                               ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
                               ->capture_default_str();
  CLI::Option* output_len = cmd->add_option("--output-len", o->output_len, "generated tokens (ignore_eos)")
                                ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
                                ->capture_default_str();
  cmd->add_option("--range-ratio", o->range_ratio, "lengths uniform in [len*(1-r), len*(1+r)]")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the prompts, lengths and arrival times")->capture_default_str();
  cmd->add_option("--vocab-size", o->vocab_size, "prompt token ids are uniform in [0, N)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31))
      ->capture_default_str();
  CLI::Option* rate =
      cmd->add_option("--request-rate", o->request_rate, "requests per second, Poisson arrivals; inf: all at once")
          ->check(Positive(/*allow_inf=*/true))
          ->default_str("inf");
  CLI::Option* concurrency =
      cmd->add_option("--max-concurrency", o->max_concurrency, "most requests in flight (default: no limit)")
          ->check(CLI::Range(int64_t{1}, kMaxInFlight));
  cmd->add_option("--slo-ttft-ms", o->slo_ttft_ms, "goodput: TTFT at most this")->check(Positive());
  cmd->add_option("--slo-tpot-ms", o->slo_tpot_ms, "goodput: TPOT at most this")->check(Positive());
  cmd->add_option("--slo-e2el-ms", o->slo_e2el_ms, "goodput: end-to-end latency at most this")
      ->check(Positive());
  cmd->add_option("--num-cards", o->num_cards, "cards (ranks) serving, for the per-card throughput")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--result-json", o->result_json, "write every figure (and each request's) to this file");
  CLI::Option* preset = cmd->add_option("--preset", o->preset,
                                        "the seed's decode workloads: decode-2k2k (2048 in + 2048 out), "
                                        "decode-1k2k (1024 in + 2048 out)")
                            ->check(CLI::IsMember({"decode-2k2k", "decode-1k2k"}));
  preset->excludes(input_len)->excludes(output_len);
  CLI::Option* sweep =
      cmd->add_option("--sweep-concurrency", o->sweep_concurrency,
                      "run each concurrency in turn (e.g. 1,2,4,8,16) and name the highest output throughput whose "
                      "mean TPOT meets --tpot-limit-ms")
          ->delimiter(',')
          ->check(CLI::Range(int64_t{1}, kMaxInFlight));
  sweep->excludes(concurrency)->excludes(rate);
  cmd->add_option("--tpot-limit-ms", o->tpot_limit_ms, "the sweep's limit on mean TPOT (the seed used 100 and 50)")
      ->check(Positive())
      ->capture_default_str()
      ->needs(sweep);
  cmd->add_option("--prompts-per-concurrency", o->prompts_per_concurrency,
                  "in a sweep without --num-prompts, each run sends this many times its concurrency (at least 16)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str()
      ->needs(sweep)
      ->excludes(num_prompts);
  cmd->add_option("--timeout", o->timeout_s, "seconds a request may go without data before it fails")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_flag("--no-progress", o->no_progress, "no progress line on stderr");
  return [o, num_prompts] {
    o->num_prompts_given = num_prompts->count() > 0;
    return RunBenchServe(*o);
  };
}

}  // namespace moe
