// Seeded Gaussian test data shared by the kernel tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace moe::kernels {

inline std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace moe::kernels
