// Per-request block tables over a BlockPool, with prefix caching. Knows token ids and block ids,
// never tensors: the engine maps token position p of a request to slot p % block_size of block
// block_table[p / block_size] in its cache storage.
//
// A full block is published under its hash as soon as slots are allocated for its last token,
// before the engine has computed it. That lets a request admitted later in the same step share
// it, and it is safe because the scheduler only adds prefix hits after the last preemption of a
// step and the engine writes a layer's KV for every scheduled token before that layer's attention
// reads any (or runs requests in schedule order).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/block_hash.h"
#include "kv/block_pool.h"

namespace moe {

using RequestId = int64_t;

struct KvCacheConfig {
  int32_t num_blocks = 0;
  int32_t block_size = 16;  // tokens per block
  bool enable_prefix_caching = true;
};

// Prompt tokens looked up in the prefix cache at admissions, and how many were found.
struct PrefixCacheStats {
  int64_t queried_tokens = 0;
  int64_t hit_tokens = 0;
  double hit_rate() const {
    return queried_tokens == 0 ? 0.0 : static_cast<double>(hit_tokens) / queried_tokens;
  }
};

// The longest cached prefix of a request's tokens, in whole blocks. It holds no references: pass
// it to the request's first AllocateSlots before anything else allocates.
struct PrefixHit {
  std::vector<BlockId> block_ids;
  std::vector<BlockHash> block_hashes;
  int64_t num_tokens = 0;          // block_ids.size() * block_size
  int64_t num_queried_tokens = 0;  // the tokens it was looked up for, for the hit rate
};

// What AllocateSlots needs to know about a request.
struct SlotRequest {
  std::span<const int32_t> token_ids;  // every known token: the prompt, then outputs so far
  uint64_t salt = 0;                   // see block_hash.h
  int64_t num_computed_tokens = 0;     // tokens whose KV is in place (hits and loaded KV included)
  int64_t num_new_tokens = 0;          // tokens computed this step (drafts included)
  int64_t num_lookahead_tokens = 0;    // extra slots past them, e.g. for a drafter's KV
  const PrefixHit* prefix_hit = nullptr;  // on a request's first allocation only
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  int32_t block_size() const { return config_.block_size; }
  int32_t num_blocks() const { return pool_.num_blocks(); }
  int64_t capacity_tokens() const { return int64_t{num_blocks()} * block_size(); }
  int32_t num_free_blocks() const { return pool_.num_free_blocks(); }
  // The fraction of blocks referenced by requests (cached free blocks count as free).
  double usage() const { return 1.0 - static_cast<double>(num_free_blocks()) / num_blocks(); }
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }
  const BlockPool& pool() const { return pool_; }

  // Finds cached blocks for the longest prefix of `token_ids`, leaving at least the last token
  // to compute (its logits are what the step is for). Empty when prefix caching is off.
  PrefixHit FindCachedPrefix(std::span<const int32_t> token_ids, uint64_t salt) const;

  // Gives request `id` slots up to num_computed + num_new + num_lookahead tokens, adopting the
  // prefix hit on its first call, and publishes the blocks that become full of known tokens.
  // Returns false and changes nothing when the pool lacks free blocks; the caller preempts.
  bool AllocateSlots(RequestId id, const SlotRequest& slots);

  // Drops the request's blocks. Published blocks stay cached until evicted. Tail blocks are
  // released first, so they are evicted before the prefix that other requests may share.
  void Free(RequestId id);

  bool has_request(RequestId id) const { return tables_.contains(id); }
  int64_t num_requests() const { return static_cast<int64_t>(tables_.size()); }
  const std::vector<BlockId>& block_table(RequestId id) const;

  // The pool's invariants, plus: every block's ref count equals the number of block tables that
  // hold it, and a published block holds the hash its owners computed for it.
  Status CheckInvariants() const;

 private:
  struct RequestBlocks {
    std::vector<BlockId> block_ids;
    std::vector<BlockHash> block_hashes;  // of the first full blocks, in order
  };

  // Hashes and publishes the blocks that are full within the first `num_tokens` tokens.
  void CacheFullBlocks(RequestBlocks& blocks, std::span<const int32_t> token_ids, uint64_t salt,
                       int64_t num_tokens);

  KvCacheConfig config_;
  BlockPool pool_;
  std::unordered_map<RequestId, RequestBlocks> tables_;
  PrefixCacheStats stats_;
};

}  // namespace moe
