// The latent cache: for every layer, the normalized c_kv and the rotated k_pe of each position —
// the only state MLA keeps between steps. It is paged: rows are grouped in blocks of block_size
// positions, and a sequence's block table says which blocks hold its positions in order. It is
// stored in F32 or in BF16 (the C16 of A8W8C16: half the bytes decode attention streams per key);
// MLA computes in F32 either way and rounds only when it writes.
#pragma once

#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace moe {

struct LayerKvCache {
  Tensor c_kv;  // [num_blocks * block_size, kv_lora_rank]
  Tensor k_pe;  // [num_blocks * block_size, qk_rope_head_dim]

  DType dtype() const { return c_kv.dtype(); }
};

// The cache dtype of a run dtype: BF16 for bf16 and w8a8, F32 for the f32 reference mode, which
// must not change numerically.
DType KvCacheDType(DType run_dtype);

struct PagedKvCache {
  PagedKvCache(const ModelConfig& config, int64_t num_layers, int64_t num_blocks, int64_t block_size, DType dtype);

  std::vector<LayerKvCache> layers;
  int64_t num_blocks;
  int64_t block_size;
  DType dtype;  // of every layer's c_kv and k_pe: kF32 or kBF16
};

// One sequence's cache of `capacity` positions: a paged cache of a single block.
struct SequenceKvCache : PagedKvCache {
  SequenceKvCache(const ModelConfig& config, int64_t num_layers, int64_t capacity, DType dtype)
      : PagedKvCache(config, num_layers, 1, capacity, dtype), capacity(capacity) {}

  static constexpr int32_t kBlockTable[1] = {0};
  int64_t capacity;
  int64_t length = 0;  // positions filled
};

}  // namespace moe
