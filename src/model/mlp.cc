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

}  // namespace moe
