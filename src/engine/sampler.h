// Turning logits into the next token: greedy or seeded temperature / top-k / top-p sampling, and
// the top log-probs reported to users.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace moe {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;        // nucleus mass kept, in (0, 1]
  int64_t top_k = 0;         // 0: no limit
  uint64_t seed = 0;
};

struct TokenLogprob {
  int32_t id;
  double logprob;
};

// The k most likely tokens under the full-precision log-softmax of `logits`, most likely first
// (ties to the lower id).
std::vector<TokenLogprob> TopLogprobs(const float* logits, int64_t vocab, int64_t k);

class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}
  int32_t Sample(const float* logits, int64_t vocab, const SamplingParams& params);

 private:
  // A uniform double in [0, 1) from 53 random bits: the same on every platform, unlike
  // std::uniform_real_distribution.
  double Uniform();

  std::mt19937_64 rng_;
};

}  // namespace moe
