// The SwiGLU MLP of dense layers, routed experts and shared experts.
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace moe {

// out[tokens, hidden] = down(silu(gate(x)) * up(x)).
void MlpForward(const MlpWeights& w, const float* x, int64_t tokens, float* out);

}  // namespace moe
