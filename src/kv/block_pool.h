// The ids of a fixed number of KV-cache blocks and what each one holds; the storage they index
// lives with the model. At any time a block is one of:
//   in use   referenced by one or more requests (ref_count > 0), possibly cached under a hash;
//   cached   no references, but its content is kept for prefix hits: it waits in an LRU queue and
//            is evicted (its hash forgotten) when a block is needed and no empty one is left;
//   empty    no references and nothing worth keeping.
// Allocation takes empty blocks first, so cached content is evicted only when the pool is full.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/block_hash.h"

namespace moe {

using BlockId = int32_t;

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Blocks Allocate can hand out: empty ones and cached ones that nobody references.
  int32_t num_free_blocks() const { return static_cast<int32_t>(empty_.size() + lru_.size()); }
  int32_t num_cached_free_blocks() const { return static_cast<int32_t>(lru_.size()); }

  // Takes an empty block or else evicts the least recently used cached one; its ref count
  // becomes 1. There must be a free block.
  BlockId Allocate();
  // Adds a reference to a block that a prefix lookup found; a cached free block leaves the queue.
  void AddRef(BlockId block);
  // Drops a reference. A block left without any becomes empty, or, if cached, the most recently
  // used entry of the LRU queue.
  void Release(BlockId block);

  // Publishes the content of an in-use block under `hash`. When another block already holds that
  // hash (two requests computed the same content), this one stays unpublished: returns false.
  bool Cache(BlockId block, BlockHash hash);
  std::optional<BlockId> FindCached(BlockHash hash) const;

  int32_t ref_count(BlockId block) const { return At(block).ref_count; }
  bool is_cached(BlockId block) const { return At(block).cached; }

  // Cross-checks the free lists, the hash map and the ref counts; for tests and debugging.
  Status CheckInvariants() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    bool cached = false;
    BlockHash hash = 0;                         // valid when cached
    std::list<BlockId>::iterator lru_position;  // valid when cached and ref_count == 0
  };

  const Block& At(BlockId block) const;
  Block& At(BlockId block);

  std::vector<Block> blocks_;
  std::vector<BlockId> empty_;  // a stack: empty blocks are interchangeable
  std::list<BlockId> lru_;      // cached blocks without references, least recently used first
  std::unordered_map<BlockHash, BlockId> cached_;
};

}  // namespace moe
