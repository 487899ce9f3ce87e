#include "model/mlp.h"

#include <memory>

#include "kernels/kernels.h"

namespace moe {

void MlpForward(const MlpWeights& w, const float* x, int64_t tokens, float* out) {
  if (w.gate.dtype == DType::kI8) {
    // Gate and up read the same activations: quantize them once.
    const int64_t hidden = w.gate.in;
    const auto x_int8 = std::make_unique_for_overwrite<int8_t[]>(tokens * hidden);
    const auto x_scales = std::make_unique_for_overwrite<float[]>(tokens);
    kernels::QuantizeRows(x, tokens, hidden, x_int8.get(), x_scales.get());
    MlpForwardQuantized(w, x_int8.get(), x_scales.get(), tokens, out);
    return;
  }
  const int64_t width = w.gate.rows();
  const auto gate = std::make_unique_for_overwrite<float[]>(tokens * width);
  const auto up = std::make_unique_for_overwrite<float[]>(tokens * width);
  kernels::Matmul(x, tokens, w.gate.view(), gate.get());
  kernels::Matmul(x, tokens, w.up.view(), up.get());
  kernels::SiluMul(gate.get(), up.get(), tokens * width, gate.get());
  kernels::Matmul(gate.get(), tokens, w.down.view(), out);
}

void MlpForwardQuantized(const MlpWeights& w, const int8_t* x, const float* x_scales, int64_t tokens, float* out) {
  const int64_t width = w.gate.rows();
  const auto gate = std::make_unique_for_overwrite<float[]>(tokens * width);
  const auto up = std::make_unique_for_overwrite<float[]>(tokens * width);
  kernels::MatmulQuantized(x, x_scales, tokens, w.gate.view(), gate.get());
  kernels::MatmulQuantized(x, x_scales, tokens, w.up.view(), up.get());
  kernels::SiluMul(gate.get(), up.get(), tokens * width, gate.get());
  kernels::Matmul(gate.get(), tokens, w.down.view(), out);
}

}  // namespace moe
