#include "model/mlp.h"

#include <vector>

#include "kernels/kernels.h"

namespace moe {

void MlpForward(const MlpWeights& w, const float* x, int64_t tokens, float* out) {
  const int64_t width = w.gate.rows();
  std::vector<float> gate(tokens * width), up(tokens * width);
  kernels::Matmul(x, tokens, w.gate.view(), gate.data());
  kernels::Matmul(x, tokens, w.up.view(), up.data());
  kernels::SiluMul(gate.data(), up.data(), tokens * width, gate.data());
  kernels::Matmul(gate.data(), tokens, w.down.view(), out);
}

void MlpForwardQuantized(const MlpWeights& w, const int8_t* x, const float* x_scales, int64_t tokens, float* out) {
  const int64_t width = w.gate.rows();
  std::vector<float> gate(tokens * width), up(tokens * width);
  kernels::MatmulQuantized(x, x_scales, tokens, w.gate.view(), gate.data());
  kernels::MatmulQuantized(x, x_scales, tokens, w.up.view(), up.data());
  kernels::SiluMul(gate.data(), up.data(), tokens * width, gate.data());
  kernels::Matmul(gate.data(), tokens, w.down.view(), out);
}

}  // namespace moe
