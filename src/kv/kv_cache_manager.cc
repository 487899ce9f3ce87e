#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <string>

namespace moe {

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(config), pool_(config.num_blocks) {
  MOE_CHECK(config.block_size > 0, "block_size must be positive, got %d", config.block_size);
}

PrefixHit KvCacheManager::FindCachedPrefix(std::span<const int32_t> token_ids,
                                           uint64_t salt) const {
  PrefixHit hit;
  if (!config_.enable_prefix_caching || token_ids.empty()) return hit;
  hit.num_queried_tokens = static_cast<int64_t>(token_ids.size());
  const int64_t max_blocks = (hit.num_queried_tokens - 1) / block_size();
  BlockHash parent = kRootBlockHash;
  for (int64_t i = 0; i < max_blocks; ++i) {
    parent = HashBlock(parent, salt, token_ids.subspan(i * block_size(), block_size()));
    const std::optional<BlockId> block = pool_.FindCached(parent);
    if (!block) break;
    hit.block_ids.push_back(*block);
    hit.block_hashes.push_back(parent);
  }
  hit.num_tokens = static_cast<int64_t>(hit.block_ids.size()) * block_size();
  return hit;
}

bool KvCacheManager::AllocateSlots(RequestId id, const SlotRequest& slots) {
  MOE_CHECK(slots.num_computed_tokens >= 0 && slots.num_new_tokens >= 0 &&
                slots.num_lookahead_tokens >= 0,
            "negative token count for request %lld", static_cast<long long>(id));
  const auto existing = tables_.find(id);
  const bool first = existing == tables_.end();
  const PrefixHit* hit = slots.prefix_hit;
  MOE_CHECK(first || hit == nullptr, "prefix hit for request %lld past its first allocation",
            static_cast<long long>(id));
  const int64_t num_held = first ? 0 : static_cast<int64_t>(existing->second.block_ids.size());
  const int64_t num_hit = hit ? static_cast<int64_t>(hit->block_ids.size()) : 0;
  if (hit) {
    MOE_CHECK(hit->num_tokens <= slots.num_computed_tokens,
              "prefix hit beyond the computed tokens of request %lld", static_cast<long long>(id));
  }

  const int64_t num_slots =
      slots.num_computed_tokens + slots.num_new_tokens + slots.num_lookahead_tokens;
  const int64_t num_needed = (num_slots + block_size() - 1) / block_size();
  const int64_t num_to_allocate = std::max<int64_t>(0, num_needed - num_held - num_hit);
  // Hit blocks that nobody references sit in the free count; taking them shrinks it.
  int64_t num_free = pool_.num_free_blocks();
  for (int64_t i = 0; i < num_hit; ++i) num_free -= pool_.ref_count(hit->block_ids[i]) == 0;
  if (num_to_allocate > num_free) return false;

  RequestBlocks& blocks = first ? tables_[id] : existing->second;
  if (hit) {
    for (BlockId block : hit->block_ids) {
      pool_.AddRef(block);
      blocks.block_ids.push_back(block);
    }
    blocks.block_hashes = hit->block_hashes;
    stats_.queried_tokens += hit->num_queried_tokens;
    stats_.hit_tokens += hit->num_tokens;
  }
  for (int64_t i = 0; i < num_to_allocate; ++i) blocks.block_ids.push_back(pool_.Allocate());
  if (config_.enable_prefix_caching) {
    const int64_t num_known = std::min<int64_t>(slots.num_computed_tokens + slots.num_new_tokens,
                                                static_cast<int64_t>(slots.token_ids.size()));
    CacheFullBlocks(blocks, slots.token_ids, slots.salt, num_known);
  }
  return true;
}

void KvCacheManager::CacheFullBlocks(RequestBlocks& blocks, std::span<const int32_t> token_ids,
                                     uint64_t salt, int64_t num_tokens) {
  const int64_t num_full = num_tokens / block_size();
  for (int64_t i = static_cast<int64_t>(blocks.block_hashes.size()); i < num_full; ++i) {
    const BlockHash parent = i == 0 ? kRootBlockHash : blocks.block_hashes[i - 1];
    const BlockHash hash =
        HashBlock(parent, salt, token_ids.subspan(i * block_size(), block_size()));
    blocks.block_hashes.push_back(hash);
    // A block already holding this content elsewhere is the one lookups find; ours stays private.
    pool_.Cache(blocks.block_ids[i], hash);
  }
}

void KvCacheManager::Free(RequestId id) {
  const auto it = tables_.find(id);
  MOE_CHECK(it != tables_.end(), "Free of request %lld without blocks", static_cast<long long>(id));
  const std::vector<BlockId>& block_ids = it->second.block_ids;
  for (auto block = block_ids.rbegin(); block != block_ids.rend(); ++block) pool_.Release(*block);
  tables_.erase(it);
}

const std::vector<BlockId>& KvCacheManager::block_table(RequestId id) const {
  const auto it = tables_.find(id);
  MOE_CHECK(it != tables_.end(), "no block table for request %lld", static_cast<long long>(id));
  return it->second.block_ids;
}

Status KvCacheManager::CheckInvariants() const {
  MOE_RETURN_IF_ERROR(pool_.CheckInvariants());
  std::vector<int32_t> num_tables_holding(pool_.num_blocks(), 0);
  for (const auto& [id, blocks] : tables_) {
    const std::string request = "request " + std::to_string(id);
    if (blocks.block_hashes.size() > blocks.block_ids.size()) {
      return Status::Error(request + " has more block hashes than blocks");
    }
    for (size_t i = 0; i < blocks.block_ids.size(); ++i) {
      const BlockId block = blocks.block_ids[i];
      ++num_tables_holding[block];
      const std::optional<BlockId> published =
          i < blocks.block_hashes.size() ? pool_.FindCached(blocks.block_hashes[i]) : std::nullopt;
      if (pool_.is_cached(block) && published != block) {
        return Status::Error(request + " holds block " + std::to_string(block) +
                             " published under another hash");
      }
    }
  }
  for (BlockId block = 0; block < pool_.num_blocks(); ++block) {
    if (pool_.ref_count(block) != num_tables_holding[block]) {
      return Status::Error("block " + std::to_string(block) + " has ref count " +
                           std::to_string(pool_.ref_count(block)) + " but " +
                           std::to_string(num_tables_holding[block]) + " tables hold it");
    }
  }
  return Status::Ok();
}

}  // namespace moe
