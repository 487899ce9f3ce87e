// A contiguous per-sequence latent cache: for every layer, the normalized c_kv and the rotated
// k_pe of each position — the only state MLA keeps between steps.
#pragma once

#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace moe {

struct LayerKvCache {
  Tensor c_kv;  // [capacity, kv_lora_rank]
  Tensor k_pe;  // [capacity, qk_rope_head_dim]
};

struct SequenceKvCache {
  SequenceKvCache(const ModelConfig& config, int64_t num_layers, int64_t capacity);

  std::vector<LayerKvCache> layers;
  int64_t capacity;
  int64_t length = 0;  // positions filled
};

}  // namespace moe
