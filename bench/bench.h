// The microbenchmark suites, registered by main in the order they should run.
#pragma once

namespace moe::bench {

void RegisterMatmulBenchmarks();
void RegisterAttentionBenchmarks();
void RegisterRoutingBenchmarks();

}  // namespace moe::bench
