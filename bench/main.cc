// moe_microbench: the machine's limits first, then every kernel suite, each reporting its rates
// next to those limits. Takes the usual Google Benchmark flags (--benchmark_filter=...).
#include <string>

#include <benchmark/benchmark.h>

#include "base/cpu_features.h"
#include "base/heap_reuse.h"
#include "base/thread_pool.h"
#include "bench.h"
#include "roofline.h"

int main(int argc, char** argv) {
  using namespace moe::bench;
  moe::ReuseFreedHeapMemory();  // as the server runs the kernels: no page faults on every call's buffers
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  const MachineLimits& limits = Limits();
  benchmark::AddCustomContext("cpu_features", moe::GetCpuFeatures().ToString());
  benchmark::AddCustomContext("threads", std::to_string(moe::DefaultThreadPool().num_threads()));
  benchmark::AddCustomContext("read_bandwidth_GBps", std::to_string(limits.read_gbps));
  benchmark::AddCustomContext("int8_peak_GOPs", std::to_string(limits.int8_gops) + " (" + limits.int8_isa + ")");
  benchmark::AddCustomContext("f32_peak_GFLOPs", std::to_string(limits.f32_gflops) + " (" + limits.f32_isa + ")");
  benchmark::AddCustomContext("bf16_peak_GFLOPs", std::to_string(limits.bf16_gflops) + " (" + limits.bf16_isa + ")");
  benchmark::AddCustomContext("amx_bf16_peak_GFLOPs",
                              std::to_string(limits.amx_bf16_gflops) + " (" + limits.amx_bf16_isa + ")");
  benchmark::AddCustomContext("amx_int8_peak_GOPs",
                              std::to_string(limits.amx_int8_gops) + " (" + limits.amx_int8_isa + ")");

  RegisterRooflineBenchmarks();
  RegisterMatmulBenchmarks();
  RegisterAttentionBenchmarks();
  RegisterRoutingBenchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
