#include "model/kv_cache.h"

namespace moe {

SequenceKvCache::SequenceKvCache(const ModelConfig& config, int64_t num_layers, int64_t capacity)
    : capacity(capacity) {
  for (int64_t i = 0; i < num_layers; ++i) {
    layers.push_back({Tensor::F32({capacity, config.kv_lora_rank}),
                      Tensor::F32({capacity, config.qk_rope_head_dim})});
  }
}

}  // namespace moe
