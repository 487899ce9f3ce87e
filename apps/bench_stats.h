// Summary statistics shared by the benchmark subcommands (bench-offline, bench-serve).
#pragma once

#include <vector>

namespace moe {

// The p-th percentile (0 <= p <= 100) with linear interpolation between the closest ranks, as
// numpy.percentile computes it by default (and so `vllm bench serve`); 0 for an empty list.
double Percentile(std::vector<double> values, double p);

// The arithmetic mean; 0 for an empty list.
double Mean(const std::vector<double>& values);

// The population standard deviation (numpy.std's default); 0 for an empty list.
double StdDev(const std::vector<double>& values);

}  // namespace moe
