// The DeepSeek-V3 architecture (and its V2 variant): embedding -> decoder layers (MLA + dense MLP
// or MoE) -> final norm -> lm_head, plus the MTP module that predicts the token after next.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "model/kv_cache.h"
#include "model/mla.h"
#include "model/moe.h"
#include "model/rope.h"
#include "model/weights.h"

namespace moe {

// One sequence's share of a batch: its new tokens, the position of the first, and the cache blocks
// of positions [0, start + tokens.size()).
struct SequenceChunk {
  std::span<const int32_t> tokens;
  int64_t start = 0;
  std::span<const int32_t> block_table;
  // Positions below this hold the prompt: they attend in the expanded form, the positions after
  // them (generated tokens, also when recomputed after a preemption) in the absorbed form.
  int64_t prompt_tokens = 0;
};

class DeepseekV3Model {
 public:
  // Reads config.json and the safetensors of `dir`; `dtype` is the precision of linear layers: kF32, kBF16 or kI8 (A8W8).
  // Only the experts in `experts` are loaded.
  static Expected<std::unique_ptr<DeepseekV3Model>> Load(const std::string& dir, DType dtype,
                                                         const ExpertSelection& experts = {});

  const ModelConfig& config() const { return config_; }
  bool has_mtp() const { return weights_.mtp.has_value(); }

  // Latent caches in KvCacheDType(run dtype): BF16 for bf16 and w8a8, F32 for f32.
  SequenceKvCache NewCache(int64_t capacity) const;
  SequenceKvCache NewMtpCache(int64_t capacity) const;
  PagedKvCache NewPagedCache(int64_t num_blocks, int64_t block_size) const;
  // Latent cache bytes one token takes over all layers.
  int64_t LatentCacheBytesPerToken() const;

  // Runs a batch of sequences' new tokens (ids < vocab_size, checked by the caller) as one: the
  // chunks' tokens are the rows of the result, in order. A token's attention form goes by its
  // position (SequenceChunk::prompt_tokens), whatever its chunk's size. Under W8A8 a token's result
  // is then the same bits however the batch is made up and its sequence chunked: every op computes
  // a row from that row alone, both attention kernels tile keys from position 0, INT8 GEMMs sum
  // exactly (the lm_head's too) and the F32 router in a fixed order. (Under F32 and BF16,
  // oneDNN's GEMMs may order a row's sums by the batch's size.) Returns the final hidden states
  // after the final norm: [total tokens, hidden].
  Tensor Forward(std::span<const SequenceChunk> batch, PagedKvCache& cache, ExpertBackend& experts) const;

  // Runs `tokens` (ids < vocab_size, checked by the caller) at positions cache.length onwards,
  // appends them to the cache and returns their final hidden states after the final norm:
  // [tokens, hidden].
  Tensor Forward(std::span<const int32_t> tokens, SequenceKvCache& cache, AttentionForm form,
                 ExpertBackend& experts) const;

  // A step with nothing to run on this rank while others run theirs: enters every MoE layer's
  // expert exchange with no tokens, as expert parallelism needs every rank in every exchange.
  void RunEmptyBatch(ExpertBackend& experts) const;

  // lm_head over `rows` final hidden states: [rows, vocab]. A row flagged in `argmax_only` (empty:
  // none) is for its first maximum alone (greedy decoding): that column and its value are exact,
  // the others may hold less than their logits (kernels::MatmulTwoPart) -- cheaper with an INT8
  // head, which also puts that column in first_max[row] when asked (-1 for the rows it leaves to
  // the caller to scan).
  Tensor Logits(const float* hidden, int64_t rows, const std::vector<bool>& argmax_only = {},
                int32_t* first_max = nullptr) const;

  // The MTP module at positions mtp_cache.length onwards: hidden[i] is the main model's final
  // hidden state at position i and next_tokens[i] the token at position i + 1. Returns the logits
  // for the token at position i + 2: [tokens, vocab].
  Tensor MtpLogits(const float* hidden, std::span<const int32_t> next_tokens, SequenceKvCache& mtp_cache,
                   AttentionForm form, ExpertBackend& experts) const;

 private:
  DeepseekV3Model(ModelConfig config, ModelWeights weights, DType dtype);

  // Embedding, decoder layers and final norm over a batch of sequences.
  Tensor Run(std::span<const int32_t> tokens, std::span<const MlaSequence> sequences, PagedKvCache& cache,
             ExpertBackend& experts) const;
  // Rows of whole sequences, run through each layer's attention together.
  struct MicroBatch {
    int64_t row_begin = 0, rows = 0;
    std::span<const MlaSequence> sequences;
  };
  // The sequences in `count` micro-batches of about equal tokens (some may be empty).
  static std::vector<MicroBatch> SplitMicroBatches(std::span<const MlaSequence> sequences, int count);
  // One decoder layer in place on h: [tokens, hidden]. Each micro-batch runs its attention and
  // starts its experts before any micro-batch's experts finish, so that with experts on other
  // ranks one's exchange travels while the next one computes.
  void Block(const LayerWeights& layer, Tensor& h, std::span<const MicroBatch> batches, LayerKvCache& cache,
             int64_t block_size, ExpertBackend& experts) const;
  Tensor Embed(const Tensor& table, std::span<const int32_t> tokens) const;

  ModelConfig config_;
  ModelWeights weights_;
  Rope rope_;
  DType cache_dtype_;  // of the latent caches it makes: KvCacheDType(run dtype)
};

}  // namespace moe
