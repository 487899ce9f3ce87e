// Seeded Gaussian test data shared by the kernel tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace moe::kernels {

inline std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A seeded Gaussian [n, k] weight, quantized per row by QuantizeRows as I8 Matmul weights are.
struct RandomInt8Weight {
  RandomInt8Weight(int64_t n, int64_t k, uint32_t seed) : q(n * k), scales(n) {
    const std::vector<float> w = Random(n * k, seed);
    QuantizeRows(w.data(), n, k, q.data(), scales.data());
  }
  TensorView view() const { return TensorView{const_cast<int8_t*>(q.data()), DType::kI8, {n(), k()}}; }
  int64_t n() const { return static_cast<int64_t>(scales.size()); }
  int64_t k() const { return static_cast<int64_t>(q.size() / scales.size()); }

  std::vector<int8_t> q;
  std::vector<float> scales;
};

}  // namespace moe::kernels
