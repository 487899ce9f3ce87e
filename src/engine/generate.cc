#include "engine/generate.h"

#include <string>

namespace moe {
namespace {

Status Validate(const ModelConfig& config, const GenerateRequest& request) {
  if (request.prompt.empty()) return Status::Error("the prompt is empty");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    const int32_t id = request.prompt[i];
    if (id < 0 || id >= config.vocab_size) {
      return Status::Error("prompt token " + std::to_string(i) + " has id " + std::to_string(id) +
                           ", outside the vocabulary [0, " + std::to_string(config.vocab_size) + ")");
    }
  }
  if (request.max_tokens < 1) return Status::Error("max_tokens must be at least 1");
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (total > config.max_position_embeddings) {
    return Status::Error("prompt of " + std::to_string(request.prompt.size()) + " tokens plus max_tokens " +
                         std::to_string(request.max_tokens) + " exceeds the model's context of " +
                         std::to_string(config.max_position_embeddings) + " tokens");
  }
  if (request.mtp_logprobs > 0 && config.num_nextn_predict_layers == 0) {
    return Status::Error("MTP log-probs were asked for, but the model has no MTP layer");
  }
  return Status::Ok();
}

}  // namespace

Expected<GenerateResult> Generate(const DeepseekV3Model& model, ExpertBackend& experts,
                                  const GenerateRequest& request, const std::function<void(int32_t)>& on_token) {
  MOE_RETURN_IF_ERROR(Validate(model.config(), request));
  const int64_t vocab = model.config().vocab_size;
  const int64_t capacity = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  SequenceKvCache cache = model.NewCache(capacity);
  SequenceKvCache mtp_cache = model.NewMtpCache(capacity);
  Sampler sampler(request.sampling.seed);
  GenerateResult result;

  std::vector<int32_t> input = request.prompt;
  AttentionForm form = AttentionForm::kExpanded;
  for (;;) {
    const Tensor hidden = model.Forward(input, cache, form, experts);
    const int64_t rows = hidden.dim(0);
    const Tensor logits = model.Logits(hidden.data<float>() + (rows - 1) * hidden.dim(1), 1);
    const int32_t token = sampler.Sample(logits.data<float>(), vocab, request.sampling);
    result.tokens.push_back(token);
    if (request.logprobs > 0) result.logprobs.push_back(TopLogprobs(logits.data<float>(), vocab, request.logprobs, token));
    if (on_token) on_token(token);

    if (request.mtp_logprobs > 0) {
      // Each hidden state pairs with the token after it, which for the last row is the one just sampled.
      std::vector<int32_t> next(input.begin() + 1, input.end());
      next.push_back(token);
      const Tensor mtp = model.MtpLogits(hidden.data<float>(), next, mtp_cache, form, experts);
      for (int64_t r = 0; r < rows; ++r) {
        result.mtp_logprobs.push_back(TopLogprobs(mtp.data<float>() + r * vocab, vocab, request.mtp_logprobs));
      }
    }

    if (!request.ignore_eos && request.eos_id && token == *request.eos_id) {
      result.finish_reason = "stop";
      break;
    }
    if (static_cast<int64_t>(result.tokens.size()) == request.max_tokens) {
      result.finish_reason = "length";
      break;
    }
    input = {token};
    form = AttentionForm::kAbsorbed;
  }
  return result;
}

}  // namespace moe
