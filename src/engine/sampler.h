// Turning logits into the next token: penalties, then greedy or seeded temperature / top-k /
// top-p / min-p sampling; and the top log-probs reported to users.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace moe {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;        // nucleus mass kept, in (0, 1]
  int64_t top_k = 0;         // 0: no limit
  double min_p = 0.0;        // drop tokens less likely than min_p times the most likely one
  // As in vLLM: repetition divides positive logits (multiplies negative ones) of tokens seen in
  // the prompt or output; presence subtracts once per token seen in the output, frequency once
  // per occurrence there.
  double repetition_penalty = 1.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  uint64_t seed = 0;

  bool has_penalties() const {
    return repetition_penalty != 1.0 || presence_penalty != 0.0 || frequency_penalty != 0.0;
  }
};

struct TokenLogprob {
  int32_t id;
  double logprob;
};

// The k most likely tokens under the full-precision log-softmax of `logits`, most likely first
// (ties to the lower id), then `sampled` when it is a token outside them (OpenAI reports the
// chosen token's own logprob even when it is not among the alternatives).
std::vector<TokenLogprob> TopLogprobs(const float* logits, int64_t vocab, int64_t k, int32_t sampled = -1);

// Applies the penalties of `params` to logits in place. Ids must be < vocab.
void ApplyPenalties(float* logits, int64_t vocab, const SamplingParams& params, std::span<const int32_t> prompt,
                    std::span<const int32_t> output);

class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}
  // Samples from logits that already carry the penalties.
  int32_t Sample(const float* logits, int64_t vocab, const SamplingParams& params);

 private:
  // A uniform double in [0, 1) from 53 random bits: the same on every platform, unlike
  // std::uniform_real_distribution.
  double Uniform();

  std::mt19937_64 rng_;
};

}  // namespace moe
