// Perplexity of a token stream under the model, over non-overlapping windows.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "model/deepseek_v3.h"

namespace moe {

struct PerplexityResult {
  double total_nll = 0;  // natural log
  int64_t scored_tokens = 0;
  int64_t windows = 0;
  double perplexity() const;
};

// Splits `ids` into consecutive windows of `window` tokens (the last may be shorter). Each window
// is run on its own, from an empty cache, with `bos` prepended when given; every token of the
// window is scored given the tokens before it in that window (the first one given only BOS, or
// not at all without BOS). on_window sees the count of windows done.
Expected<PerplexityResult> Perplexity(const DeepseekV3Model& model, ExpertBackend& experts,
                                      const std::vector<int32_t>& ids, int64_t window,
                                      std::optional<int32_t> bos,
                                      const std::function<void(int64_t done, int64_t total)>& on_window = {});

}  // namespace moe
