#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace moe {
namespace {

// -log softmax(logits)[target], in double.
double NegativeLogLikelihood(const float* logits, int64_t vocab, int32_t target) {
  const double max = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  return max + std::log(sum) - logits[target];
}

}  // namespace

double PerplexityResult::perplexity() const { return std::exp(total_nll / static_cast<double>(scored_tokens)); }

Expected<PerplexityResult> Perplexity(const DeepseekV3Model& model, ExpertBackend& experts,
                                      const std::vector<int32_t>& ids, int64_t window, std::optional<int32_t> bos,
                                      const std::function<void(int64_t, int64_t)>& on_window) {
  const ModelConfig& config = model.config();
  if (window < 2) return Status::Error("the window must hold at least 2 tokens");
  if (window + (bos ? 1 : 0) > config.max_position_embeddings) {
    return Status::Error("a window of " + std::to_string(window) + " tokens exceeds the model's context of " +
                         std::to_string(config.max_position_embeddings));
  }
  for (int32_t id : ids) {
    if (id < 0 || id >= config.vocab_size) return Status::Error("token id " + std::to_string(id) + " is outside the vocabulary");
  }
  const int64_t total_windows = (static_cast<int64_t>(ids.size()) + window - 1) / window;
  PerplexityResult result;
  for (int64_t start = 0; start < static_cast<int64_t>(ids.size()); start += window) {
    std::vector<int32_t> input;
    if (bos) input.push_back(*bos);
    input.insert(input.end(), ids.begin() + start, ids.begin() + std::min<int64_t>(start + window, ids.size()));
    if (input.size() < 2) continue;

    SequenceKvCache cache = model.NewCache(static_cast<int64_t>(input.size()));
    const Tensor hidden = model.Forward(input, cache, AttentionForm::kExpanded, experts);
    const int64_t rows = static_cast<int64_t>(input.size()) - 1;
    const Tensor logits = model.Logits(hidden.data<float>(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      result.total_nll += NegativeLogLikelihood(logits.data<float>() + r * config.vocab_size, config.vocab_size, input[r + 1]);
    }
    result.scored_tokens += rows;
    ++result.windows;
    if (on_window) on_window(result.windows, total_windows);
  }
  if (result.scored_tokens == 0) return Status::Error("the text has too few tokens to score");
  return result;
}

}  // namespace moe
