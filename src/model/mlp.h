// The SwiGLU MLP of dense layers, routed experts and shared experts.
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace moe {

// out[tokens, hidden] = down(silu(gate(x)) * up(x)).
void MlpForward(const MlpWeights& w, const float* x, int64_t tokens, float* out);

// The same for I8 weights from activations already quantized by QuantizeRows: equal to
// MlpForward of the rows they were quantized from.
void MlpForwardQuantized(const MlpWeights& w, const int8_t* x, const float* x_scales, int64_t tokens, float* out);

}  // namespace moe
