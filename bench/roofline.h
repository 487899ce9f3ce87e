// The machine's limits, measured in the same run as the kernels they bound, and the counters that
// put a kernel's rate next to them.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>

#include <benchmark/benchmark.h>

namespace moe::bench {

struct MachineLimits {
  double read_gbps = 0;    // STREAM-like read bandwidth of a buffer far larger than the caches
  double int8_gops = 0;    // INT8 multiply-adds x 2, tight VNNI (or AVX2) loop on every thread
  double f32_gflops = 0;   // FP32 FMAs x 2
  double bf16_gflops = 0;  // BF16 dot products x 2 (AVX512_BF16), or the FP32 peak without it
  double amx_bf16_gflops = 0;  // BF16 dot products x 2 on AMX tiles, or bf16_gflops without AMX
  double amx_int8_gops = 0;    // INT8 multiply-adds x 2 on AMX tiles, or int8_gops without AMX-INT8
  std::string int8_isa, f32_isa, bf16_isa, amx_bf16_isa, amx_int8_isa;
};

// Measured on first use (about a second), then fixed for the run.
const MachineLimits& Limits();

// Runs `body` as the benchmark loop and returns the wall-clock seconds of its fastest iteration:
// the kernels are multithreaded, so the main thread's CPU time would mislead, and other processes
// can only slow an iteration down, so the fastest is the best estimate of the kernel itself (the
// limits are measured the same way).
template <typename Body>
double FastestIteration(benchmark::State& state, Body body) {
  double best = 1e30;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    body();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// Adds the counters each kernel benchmark reports from the bytes it must move from memory and the
// operations it must do per call, and the seconds a call took: GB/s, GOP/s and roof%, the time the
// roofline allows, max(bytes / bandwidth, ops / peak), as a percentage of the time measured.
void ReportRoofline(benchmark::State& state, double seconds, double bytes, double ops, double peak_gops);

// Registers the limit measurements themselves as benchmarks, so they appear in the table.
void RegisterRooflineBenchmarks();

}  // namespace moe::bench
