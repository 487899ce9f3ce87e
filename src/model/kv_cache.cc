#include "model/kv_cache.h"

namespace moe {

DType KvCacheDType(DType run_dtype) { return run_dtype == DType::kF32 ? DType::kF32 : DType::kBF16; }

PagedKvCache::PagedKvCache(const ModelConfig& config, int64_t num_layers, int64_t num_blocks, int64_t block_size,
                           DType dtype)
    : num_blocks(num_blocks), block_size(block_size), dtype(dtype) {
  const int64_t rows = num_blocks * block_size;
  MOE_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "a latent cache is F32 or BF16, not %s",
            std::string(DTypeName(dtype)).c_str());
  for (int64_t i = 0; i < num_layers; ++i) {
    layers.push_back({Tensor(dtype, {rows, config.kv_lora_rank}), Tensor(dtype, {rows, config.qk_rope_head_dim})});
  }
}

}  // namespace moe
