#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moe {
namespace {

// Token ids ordered by logit, highest first, ties to the lower id.
std::vector<int32_t> SortedIds(const float* logits, int64_t vocab, int64_t keep) {
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  auto higher = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), higher);
  ids.resize(keep);
  return ids;
}

}  // namespace

std::vector<TokenLogprob> TopLogprobs(const float* logits, int64_t vocab, int64_t k, int32_t sampled) {
  const double max = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = max + std::log(sum);
  std::vector<TokenLogprob> top;
  for (int32_t id : SortedIds(logits, vocab, std::min(k, vocab))) top.push_back({id, logits[id] - log_z});
  const bool listed = std::any_of(top.begin(), top.end(), [&](const TokenLogprob& t) { return t.id == sampled; });
  if (sampled >= 0 && !listed) top.push_back({sampled, logits[sampled] - log_z});
  return top;
}

void ApplyPenalties(float* logits, int64_t vocab, const SamplingParams& params, std::span<const int32_t> prompt,
                    std::span<const int32_t> output) {
  if (!params.has_penalties()) return;
  std::vector<int32_t> output_counts(vocab, 0);
  std::vector<bool> seen(vocab, false);
  for (int32_t id : prompt) seen[id] = true;
  for (int32_t id : output) {
    ++output_counts[id];
    seen[id] = true;
  }
  for (int64_t id = 0; id < vocab; ++id) {
    float& l = logits[id];
    if (seen[id] && params.repetition_penalty != 1.0) {
      l = static_cast<float>(l > 0 ? l / params.repetition_penalty : l * params.repetition_penalty);
    }
    if (output_counts[id] > 0) {
      l -= static_cast<float>(params.presence_penalty + params.frequency_penalty * output_counts[id]);
    }
  }
}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::Sample(const float* logits, int64_t vocab, const SamplingParams& params) {
  // Greedy: the first of the highest logits, the same token SortedIds puts first.
  if (params.temperature <= 0.0) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);

  const int64_t keep = params.top_k > 0 ? std::min(params.top_k, vocab) : vocab;
  const std::vector<int32_t> ids = SortedIds(logits, vocab, keep);
  std::vector<double> probs(ids.size());
  const double max = logits[ids[0]];
  double total = 0;
  for (size_t i = 0; i < ids.size(); ++i) total += (probs[i] = std::exp((logits[ids[i]] - max) / params.temperature));

  // min-p: relative to the most likely token, whose weight is exp(0) = 1.
  size_t kept = ids.size();
  while (kept > 1 && probs[kept - 1] < params.min_p) total -= probs[--kept];

  // Nucleus: the shortest prefix of the sorted tokens whose mass reaches top_p.
  size_t nucleus = kept;
  double mass = 0;
  for (size_t i = 0; i < kept; ++i) {
    mass += probs[i] / total;
    if (mass >= params.top_p) {
      nucleus = i + 1;
      break;
    }
  }
  const double nucleus_total = std::accumulate(probs.begin(), probs.begin() + nucleus, 0.0);
  double r = Uniform() * nucleus_total;
  for (size_t i = 0; i < nucleus; ++i) {
    r -= probs[i];
    if (r < 0) return ids[i];
  }
  return ids[nucleus - 1];
}

}  // namespace moe
