#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace moe {
namespace {

// YaRN's attention-temperature factor for a context stretched `factor` times.
double YarnMscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// The rotary dimension below which a frequency completes fewer than `rotations` turns over the
// original context.
double CorrectionDim(double rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

Rope BuildRope(const ModelConfig& config) {
  const int64_t dim = config.qk_rope_head_dim;
  const double base = config.rope_theta;
  Rope rope;
  rope.inv_freq.resize(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) rope.inv_freq[i] = 1.0 / std::pow(base, 2.0 * i / dim);
  if (!config.yarn) return rope;

  // YaRN: high frequencies (many turns over the original context) keep their value, low ones
  // are interpolated by 1/factor, with a linear ramp between the two correction dimensions.
  const YarnScaling& yarn = *config.yarn;
  const double max_pos = static_cast<double>(yarn.original_max_position_embeddings);
  double low = std::floor(CorrectionDim(yarn.beta_fast, dim, base, max_pos));
  double high = std::ceil(CorrectionDim(yarn.beta_slow, dim, base, max_pos));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    rope.inv_freq[i] = rope.inv_freq[i] / yarn.factor * ramp + rope.inv_freq[i] * (1.0 - ramp);
  }
  rope.scale = YarnMscale(yarn.factor, yarn.mscale) / YarnMscale(yarn.factor, yarn.mscale_all_dim);
  return rope;
}

}  // namespace moe
