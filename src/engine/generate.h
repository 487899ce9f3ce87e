// One request run to completion on one sequence: prefill in the expanded attention form, then
// decode token by token in the absorbed form, with the MTP module run right after the main model
// when MTP log-probs are asked for.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "engine/sampler.h"
#include "model/deepseek_v3.h"

namespace moe {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  int64_t logprobs = 0;      // top-k log-probs per generated token
  int64_t mtp_logprobs = 0;  // top-k log-probs of the MTP head per position with a known next token
  std::optional<int32_t> eos_id;
  bool ignore_eos = false;
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  std::vector<std::vector<TokenLogprob>> logprobs;
  std::vector<std::vector<TokenLogprob>> mtp_logprobs;
  std::string finish_reason;  // "stop" (end of sequence) or "length"
};

// Validates the request against the model (empty prompt, ids out of range, context length) and
// runs it. on_token, if set, sees each token as it is generated.
Expected<GenerateResult> Generate(const DeepseekV3Model& model, ExpertBackend& experts,
                                  const GenerateRequest& request,
                                  const std::function<void(int32_t)>& on_token = {});

}  // namespace moe
