#include "model/deepseek_v3.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/kernels.h"
#include "model/mlp.h"

namespace moe {
namespace {

// Logits [rows, vocab] of the final hidden states, each row independent of the batch to the bit:
// an INT8 head through the exact INT32 GEMM, its activations in two INT8 parts (INT8 alone cost the
// logits most of their accuracy: tests/model/quantized_accuracy_test.cc), an F32 or BF16 one summed
// in a fixed order. Rows flagged `argmax_only` as DeepseekV3Model::Logits says.
Tensor HeadLogits(const Linear& head, const float* hidden, int64_t rows, const std::vector<bool>& argmax_only = {},
                  int32_t* first_max = nullptr) {
  Tensor logits = Tensor::ForOverwrite(DType::kF32, {rows, head.rows()});
  if (head.dtype == DType::kI8) {
    kernels::MatmulTwoPart(hidden, rows, head.view(), logits.data<float>(), argmax_only,
                           head.row_norms.empty() ? nullptr : head.row_norms.data<float>(), first_max);
  } else {
    kernels::BatchInvariantMatmul(hidden, rows, head.view(), logits.data<float>());
    if (first_max) std::fill_n(first_max, rows, -1);
  }
  return logits;
}

}  // namespace

Expected<std::unique_ptr<DeepseekV3Model>> DeepseekV3Model::Load(const std::string& dir, DType dtype,
                                                                  const ExpertSelection& experts) {
  MOE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir + "/config.json"));
  MOE_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(dir));
  MOE_ASSIGN_OR_RETURN(ModelWeights weights, LoadModelWeights(checkpoint, config, dtype, experts));
  return std::unique_ptr<DeepseekV3Model>(new DeepseekV3Model(std::move(config), std::move(weights), dtype));
}

DeepseekV3Model::DeepseekV3Model(ModelConfig config, ModelWeights weights, DType dtype)
    : config_(std::move(config)), weights_(std::move(weights)), rope_(BuildRope(config_)),
      cache_dtype_(KvCacheDType(dtype)) {}

SequenceKvCache DeepseekV3Model::NewCache(int64_t capacity) const {
  return SequenceKvCache(config_, config_.num_hidden_layers, capacity, cache_dtype_);
}

SequenceKvCache DeepseekV3Model::NewMtpCache(int64_t capacity) const {
  return SequenceKvCache(config_, has_mtp() ? 1 : 0, capacity, cache_dtype_);
}

Tensor DeepseekV3Model::Embed(const Tensor& table, std::span<const int32_t> tokens) const {
  const int64_t hidden = config_.hidden_size;
  Tensor h = Tensor::F32({static_cast<int64_t>(tokens.size()), hidden});
  for (size_t t = 0; t < tokens.size(); ++t) {
    MOE_CHECK(tokens[t] >= 0 && tokens[t] < config_.vocab_size, "token id %d out of range", tokens[t]);
    std::memcpy(h.data<float>() + t * hidden, table.data<float>() + tokens[t] * hidden, hidden * sizeof(float));
  }
  return h;
}

void DeepseekV3Model::Block(const LayerWeights& layer, Tensor& h, std::span<const MicroBatch> batches,
                            LayerKvCache& cache, int64_t block_size, ExpertBackend& experts) const {
  const int64_t hidden = config_.hidden_size, n = h.dim(0) * hidden;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  // Every row of both is written (by the norms, and by attention and the MLP or experts) before
  // it is read.
  const auto normed = std::make_unique_for_overwrite<float[]>(n), delta = std::make_unique_for_overwrite<float[]>(n);
  float* x = h.data<float>();
  auto add_delta = [&](const MicroBatch& b) {
    ParallelFor(b.rows, [&](int64_t begin, int64_t end) {
      for (int64_t i = (b.row_begin + begin) * hidden; i < (b.row_begin + end) * hidden; ++i) x[i] += delta[i];
    });
  };

  std::vector<std::unique_ptr<PendingExperts>> pending;
  for (const MicroBatch& b : batches) {
    const int64_t offset = b.row_begin * hidden;
    if (b.rows > 0) {
      kernels::RmsNorm(x + offset, layer.input_norm.data<float>(), b.rows, hidden, eps, normed.get() + offset);
      MlaForward(layer.attention, config_, rope_, normed.get() + offset, b.sequences, cache, block_size,
                 delta.get() + offset);
      add_delta(b);
      kernels::RmsNorm(x + offset, layer.post_attention_norm.data<float>(), b.rows, hidden, eps,
                       normed.get() + offset);
    }
    if (layer.moe) {
      // Every micro-batch, even an empty one, takes part in the experts' exchanges.
      pending.push_back(StartMoe(*layer.moe, config_, experts, normed.get() + offset, b.rows));
    } else {
      MlpForward(*layer.dense, normed.get() + offset, b.rows, delta.get() + offset);
      add_delta(b);
    }
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    pending[i]->Finish(delta.get() + batches[i].row_begin * hidden);
    add_delta(batches[i]);
  }
}

PagedKvCache DeepseekV3Model::NewPagedCache(int64_t num_blocks, int64_t block_size) const {
  return PagedKvCache(config_, config_.num_hidden_layers, num_blocks, block_size, cache_dtype_);
}

int64_t DeepseekV3Model::LatentCacheBytesPerToken() const {
  return config_.num_hidden_layers * (config_.kv_lora_rank + config_.qk_rope_head_dim) *
         static_cast<int64_t>(DTypeSize(cache_dtype_));
}

Tensor DeepseekV3Model::Forward(std::span<const SequenceChunk> batch, PagedKvCache& cache,
                                ExpertBackend& experts) const {
  std::vector<int32_t> tokens;
  std::vector<MlaSequence> sequences;
  for (const SequenceChunk& chunk : batch) {
    tokens.insert(tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
    // The form goes by position, never by how the position was batched: the same position may
    // come in a long chunk, a one-token chunk (chunked prefill, a prefix-cache hit that leaves one
    // token) or, once generated, a decode step or a recompute after preemption; the two forms
    // agree only up to float rounding, which INT8 quantization downstream can turn into different
    // tokens. Prompts take the expanded form, which costs a third of the absorbed one's
    // arithmetic per query (qk 192 and v 128 per head against 576 and 512 for V3).
    const int64_t end = chunk.start + static_cast<int64_t>(chunk.tokens.size());
    const int64_t split = std::clamp(chunk.prompt_tokens, chunk.start, end);
    if (split > chunk.start) {
      sequences.push_back({split - chunk.start, chunk.start, chunk.block_table, AttentionForm::kExpanded});
    }
    if (end > split) sequences.push_back({end - split, split, chunk.block_table, AttentionForm::kAbsorbed});
  }
  return Run(tokens, sequences, cache, experts);
}

Tensor DeepseekV3Model::Forward(std::span<const int32_t> tokens, SequenceKvCache& cache, AttentionForm form,
                                ExpertBackend& experts) const {
  const MlaSequence sequence{static_cast<int64_t>(tokens.size()), cache.length, SequenceKvCache::kBlockTable, form};
  Tensor h = Run(tokens, std::span(&sequence, 1), cache, experts);
  cache.length += static_cast<int64_t>(tokens.size());
  return h;
}

std::vector<DeepseekV3Model::MicroBatch> DeepseekV3Model::SplitMicroBatches(std::span<const MlaSequence> sequences,
                                                                            int count) {
  int64_t total = 0;
  for (const MlaSequence& s : sequences) total += s.tokens;
  std::vector<MicroBatch> out(count);
  size_t next = 0;
  int64_t rows = 0;
  for (int p = 0; p < count; ++p) {
    const size_t first = next;
    out[p].row_begin = rows;
    while (next < sequences.size() && (p == count - 1 || rows < total * (p + 1) / count)) {
      rows += sequences[next++].tokens;
    }
    out[p].rows = rows - out[p].row_begin;
    out[p].sequences = sequences.subspan(first, next - first);
  }
  return out;
}

Tensor DeepseekV3Model::Run(std::span<const int32_t> tokens, std::span<const MlaSequence> sequences,
                            PagedKvCache& cache, ExpertBackend& experts) const {
  Tensor h = Embed(weights_.embed, tokens);
  const std::vector<MicroBatch> batches = SplitMicroBatches(sequences, experts.micro_batches());
  for (size_t i = 0; i < weights_.layers.size(); ++i) {
    Block(weights_.layers[i], h, batches, cache.layers[i], cache.block_size, experts);
  }
  kernels::RmsNorm(h.data<float>(), weights_.final_norm.data<float>(), h.dim(0), config_.hidden_size,
                   static_cast<float>(config_.rms_norm_eps), h.data<float>());
  return h;
}

void DeepseekV3Model::RunEmptyBatch(ExpertBackend& experts) const {
  // The same exchanges, in the same order, as Block's: every micro-batch starts, then finishes.
  for (const LayerWeights& layer : weights_.layers) {
    if (!layer.moe) continue;
    std::vector<std::unique_ptr<PendingExperts>> pending;
    for (int i = 0; i < experts.micro_batches(); ++i) {
      pending.push_back(experts.Start(*layer.moe, nullptr, 0, nullptr, nullptr, config_.num_experts_per_tok));
    }
    for (auto& p : pending) p->Finish(nullptr);
  }
}

Tensor DeepseekV3Model::Logits(const float* hidden, int64_t rows, const std::vector<bool>& argmax_only,
                               int32_t* first_max) const {
  return HeadLogits(weights_.lm_head, hidden, rows, argmax_only, first_max);
}

Tensor DeepseekV3Model::MtpLogits(const float* main_hidden, std::span<const int32_t> next_tokens,
                                  SequenceKvCache& mtp_cache, AttentionForm form, ExpertBackend& experts) const {
  MOE_CHECK(has_mtp(), "the model has no MTP layer");
  const MtpWeights& mtp = *weights_.mtp;
  const int64_t tokens = static_cast<int64_t>(next_tokens.size()), hidden = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);

  // eh_proj input: [enorm(embedding of the next token); hnorm(main hidden state)].
  Tensor embedded = Embed(mtp.embed, next_tokens);
  std::vector<float> joined(tokens * 2 * hidden);
  kernels::RmsNorm(embedded.data<float>(), mtp.enorm.data<float>(), tokens, hidden, eps, embedded.data<float>());
  std::vector<float> h_normed(tokens * hidden);
  kernels::RmsNorm(main_hidden, mtp.hnorm.data<float>(), tokens, hidden, eps, h_normed.data());
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(&joined[t * 2 * hidden], embedded.data<float>() + t * hidden, hidden * sizeof(float));
    std::memcpy(&joined[t * 2 * hidden + hidden], &h_normed[t * hidden], hidden * sizeof(float));
  }
  Tensor h = Tensor::F32({tokens, hidden});
  kernels::Matmul(joined.data(), tokens, mtp.eh_proj.view(), h.data<float>());

  const MlaSequence sequence{tokens, mtp_cache.length, SequenceKvCache::kBlockTable, form};
  const MicroBatch whole{0, tokens, std::span(&sequence, 1)};
  Block(mtp.block, h, std::span(&whole, 1), mtp_cache.layers[0], mtp_cache.block_size, experts);
  mtp_cache.length += tokens;
  kernels::RmsNorm(h.data<float>(), mtp.head_norm.data<float>(), tokens, hidden, eps, h.data<float>());
  return HeadLogits(mtp.head, h.data<float>(), tokens);
}

}  // namespace moe
