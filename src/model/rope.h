// Rotary-embedding frequencies with YaRN scaling, as DeepSeek-V3 configures them.
#pragma once

#include <vector>

#include "kernels/kernels.h"
#include "model/config.h"

namespace moe {

struct Rope {
  std::vector<double> inv_freq;  // qk_rope_head_dim / 2 entries
  double scale = 1.0;            // YaRN's cos/sin factor

  kernels::RopeParams params() const {
    return kernels::RopeParams{inv_freq.data(), static_cast<int64_t>(inv_freq.size()) * 2, scale};
  }
};

Rope BuildRope(const ModelConfig& config);

}  // namespace moe
