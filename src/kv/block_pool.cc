#include "kv/block_pool.h"

#include <string>

namespace moe {

BlockPool::BlockPool(int32_t num_blocks) : blocks_(num_blocks) {
  MOE_CHECK(num_blocks > 0, "a block pool needs blocks, got %d", num_blocks);
  // Reversed so that block 0 is handed out first: easier to read in tests and logs.
  for (BlockId id = num_blocks - 1; id >= 0; --id) empty_.push_back(id);
}

const BlockPool::Block& BlockPool::At(BlockId block) const {
  MOE_CHECK(block >= 0 && block < num_blocks(), "block id %d outside [0, %d)", block, num_blocks());
  return blocks_[block];
}

BlockPool::Block& BlockPool::At(BlockId block) {
  return const_cast<Block&>(static_cast<const BlockPool&>(*this).At(block));
}

BlockId BlockPool::Allocate() {
  BlockId id;
  if (!empty_.empty()) {
    id = empty_.back();
    empty_.pop_back();
  } else {
    MOE_CHECK(!lru_.empty(), "Allocate on a pool with no free block");
    id = lru_.front();
    lru_.pop_front();
    Block& evicted = blocks_[id];
    cached_.erase(evicted.hash);
    evicted.cached = false;
  }
  blocks_[id].ref_count = 1;
  return id;
}

void BlockPool::AddRef(BlockId block) {
  Block& b = At(block);
  MOE_CHECK(b.ref_count > 0 || b.cached, "AddRef on empty block %d", block);
  if (b.ref_count == 0) lru_.erase(b.lru_position);
  ++b.ref_count;
}

void BlockPool::Release(BlockId block) {
  Block& b = At(block);
  MOE_CHECK(b.ref_count > 0, "Release of unreferenced block %d", block);
  if (--b.ref_count > 0) return;
  if (b.cached) {
    b.lru_position = lru_.insert(lru_.end(), block);
  } else {
    empty_.push_back(block);
  }
}

bool BlockPool::Cache(BlockId block, BlockHash hash) {
  Block& b = At(block);
  MOE_CHECK(b.ref_count > 0 && !b.cached, "Cache of block %d that is free or already cached",
            block);
  if (!cached_.emplace(hash, block).second) return false;
  b.cached = true;
  b.hash = hash;
  return true;
}

std::optional<BlockId> BlockPool::FindCached(BlockHash hash) const {
  const auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

Status BlockPool::CheckInvariants() const {
  std::vector<int> in_empty(blocks_.size(), 0), in_lru(blocks_.size(), 0);
  for (BlockId id : empty_) ++in_empty[id];
  for (BlockId id : lru_) ++in_lru[id];
  for (BlockId id = 0; id < num_blocks(); ++id) {
    const Block& b = blocks_[id];
    const std::string name = "block " + std::to_string(id);
    if (b.ref_count < 0) return Status::Error(name + " has a negative ref count");
    const int expected_empty = b.ref_count == 0 && !b.cached;
    const int expected_lru = b.ref_count == 0 && b.cached;
    if (in_empty[id] != expected_empty) return Status::Error(name + ": wrong empty membership");
    if (in_lru[id] != expected_lru) return Status::Error(name + ": wrong LRU membership");
    if (expected_lru && *b.lru_position != id) return Status::Error(name + ": stale LRU position");
    if (b.cached) {
      const auto it = cached_.find(b.hash);
      if (it == cached_.end() || it->second != id) return Status::Error(name + ": not in hash map");
    }
  }
  for (const auto& [hash, id] : cached_) {
    if (!blocks_[id].cached || blocks_[id].hash != hash) {
      return Status::Error("hash map entry for block " + std::to_string(id) + " is stale");
    }
  }
  return Status::Ok();
}

}  // namespace moe
