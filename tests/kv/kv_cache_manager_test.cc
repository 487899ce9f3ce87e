#include "kv/kv_cache_manager.h"

#include <numeric>
#include <vector>

#include <gtest/gtest.h>

namespace moe {
namespace {

std::vector<int32_t> Iota(int64_t n, int32_t first) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

void ExpectConsistent(const KvCacheManager& kv) {
  const Status status = kv.CheckInvariants();
  EXPECT_TRUE(status.ok()) << status.message();
}

// A whole prompt computed in one step, the way the scheduler admits a request.
bool AdmitWhole(KvCacheManager& kv, RequestId id, const std::vector<int32_t>& tokens,
                uint64_t salt = 0, int64_t* hit_tokens = nullptr) {
  const PrefixHit hit = kv.FindCachedPrefix(tokens, salt);
  if (hit_tokens) *hit_tokens = hit.num_tokens;
  return kv.AllocateSlots(id, {.token_ids = tokens,
                               .salt = salt,
                               .num_computed_tokens = hit.num_tokens,
                               .num_new_tokens = static_cast<int64_t>(tokens.size()) -
                                                 hit.num_tokens,
                               .prefix_hit = &hit});
}

TEST(KvCacheManagerTest, AllocatesWholeBlocksAndFailsWithoutSideEffects) {
  KvCacheManager kv({.num_blocks = 4, .block_size = 4});
  EXPECT_EQ(kv.capacity_tokens(), 16);
  const std::vector<int32_t> tokens = Iota(9, 1);
  ASSERT_TRUE(kv.AllocateSlots(1, {.token_ids = tokens, .num_new_tokens = 9}));
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  EXPECT_DOUBLE_EQ(kv.usage(), 0.75);
  // Growing within the last block takes nothing; past it, a new block.
  ASSERT_TRUE(kv.AllocateSlots(1, {.token_ids = tokens, .num_computed_tokens = 9,
                                   .num_new_tokens = 3}));
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  EXPECT_FALSE(kv.AllocateSlots(2, {.token_ids = tokens, .num_new_tokens = 8}));
  EXPECT_FALSE(kv.has_request(2));
  EXPECT_EQ(kv.num_free_blocks(), 1);
  ExpectConsistent(kv);
  kv.Free(1);
  EXPECT_EQ(kv.num_free_blocks(), 4);
  EXPECT_FALSE(kv.has_request(1));
  ExpectConsistent(kv);
}

TEST(KvCacheManagerTest, LookaheadSlotsAreAllocatedButNeverPublished) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 4});
  const std::vector<int32_t> tokens = Iota(6, 1);
  ASSERT_TRUE(kv.AllocateSlots(1, {.token_ids = tokens, .num_new_tokens = 6,
                                   .num_lookahead_tokens = 3}));
  EXPECT_EQ(kv.block_table(1).size(), 3u);  // 9 slots
  // Only the block full of known tokens is published.
  EXPECT_TRUE(kv.pool().is_cached(kv.block_table(1)[0]));
  EXPECT_FALSE(kv.pool().is_cached(kv.block_table(1)[1]));
  ExpectConsistent(kv);
}

TEST(KvCacheManagerTest, DraftTokensAreNeverHashed) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 4});
  const std::vector<int32_t> tokens = Iota(7, 1);
  ASSERT_TRUE(kv.AllocateSlots(1, {.token_ids = tokens, .num_new_tokens = 7}));
  // A decode of token 7 (position 6) with three drafts fills block 1 with two unknown tokens.
  ASSERT_TRUE(kv.AllocateSlots(1, {.token_ids = tokens, .num_computed_tokens = 6,
                                   .num_new_tokens = 4}));
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  EXPECT_FALSE(kv.pool().is_cached(kv.block_table(1)[1]));
  ExpectConsistent(kv);
}

TEST(KvCacheManagerTest, LookupLeavesTheLastTokenToCompute) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 4});
  const std::vector<int32_t> tokens = Iota(8, 1);
  ASSERT_TRUE(AdmitWhole(kv, 1, tokens));
  // Both blocks are cached, but the same 8 tokens need the last one's logits: one block hits.
  EXPECT_EQ(kv.FindCachedPrefix(tokens, 0).num_tokens, 4);
  std::vector<int32_t> longer = tokens;
  longer.push_back(99);
  EXPECT_EQ(kv.FindCachedPrefix(longer, 0).num_tokens, 8);
  EXPECT_EQ(kv.FindCachedPrefix(std::vector<int32_t>{1}, 0).num_tokens, 0);
}

TEST(KvCacheManagerTest, SharedPrefixIsComputedOnce) {
  constexpr int64_t kBlock = 16, kPrefix = 1024, kSuffix = 20, kRequests = 8;
  KvCacheManager kv({.num_blocks = 256, .block_size = kBlock});
  const std::vector<int32_t> system_prompt = Iota(kPrefix, 100);
  int64_t computed = 0;
  for (RequestId id = 0; id < kRequests; ++id) {
    std::vector<int32_t> prompt = system_prompt;
    const std::vector<int32_t> suffix = Iota(kSuffix, 5000 + 100 * static_cast<int32_t>(id));
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    int64_t hit = 0;
    ASSERT_TRUE(AdmitWhole(kv, id, prompt, 0, &hit));
    EXPECT_EQ(hit, id == 0 ? 0 : kPrefix);
    computed += static_cast<int64_t>(prompt.size()) - hit;
  }
  EXPECT_EQ(computed, kPrefix + kRequests * kSuffix);
  EXPECT_EQ(kv.prefix_cache_stats().queried_tokens, kRequests * (kPrefix + kSuffix));
  EXPECT_EQ(kv.prefix_cache_stats().hit_tokens, (kRequests - 1) * kPrefix);
  // Every request holds the same prefix blocks.
  for (int64_t i = 0; i < kPrefix / kBlock; ++i) {
    EXPECT_EQ(kv.pool().ref_count(kv.block_table(0)[i]), kRequests);
    EXPECT_EQ(kv.block_table(kRequests - 1)[i], kv.block_table(0)[i]);
  }
  ExpectConsistent(kv);
  // Once everyone is gone the prefix stays cached for the next request.
  for (RequestId id = 0; id < kRequests; ++id) kv.Free(id);
  int64_t hit = 0;
  ASSERT_TRUE(AdmitWhole(kv, 100, Iota(kPrefix + 1, 100), 0, &hit));
  EXPECT_EQ(hit, kPrefix);
  ExpectConsistent(kv);
}

TEST(KvCacheManagerTest, SaltSeparatesIdenticalTokens) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 4});
  const std::vector<int32_t> tokens = Iota(9, 1);
  ASSERT_TRUE(AdmitWhole(kv, 1, tokens, /*salt=*/1));
  EXPECT_EQ(kv.FindCachedPrefix(tokens, 2).num_tokens, 0);
  EXPECT_EQ(kv.FindCachedPrefix(tokens, 1).num_tokens, 8);
}

TEST(KvCacheManagerTest, HitsOnFreeCachedBlocksCountAgainstFreeSpace) {
  KvCacheManager kv({.num_blocks = 3, .block_size = 4});
  ASSERT_TRUE(AdmitWhole(kv, 1, Iota(9, 1)));
  kv.Free(1);  // three cached free blocks (the third partially filled, so empty)
  EXPECT_EQ(kv.num_free_blocks(), 3);
  // 13 tokens: two hit blocks, two new ones; only one block is left once the hits are taken.
  const std::vector<int32_t> longer = Iota(13, 1);
  const PrefixHit hit = kv.FindCachedPrefix(longer, 0);
  ASSERT_EQ(hit.num_tokens, 8);
  EXPECT_FALSE(kv.AllocateSlots(2, {.token_ids = longer, .num_computed_tokens = 8,
                                    .num_new_tokens = 5, .prefix_hit = &hit}));
  EXPECT_EQ(kv.pool().ref_count(hit.block_ids[0]), 0);
  EXPECT_EQ(kv.prefix_cache_stats().queried_tokens, 9);  // the failed admission is not counted
  ExpectConsistent(kv);
}

TEST(KvCacheManagerTest, FreeEvictsTailBlocksBeforeThePrefix) {
  KvCacheManager kv({.num_blocks = 4, .block_size = 4});
  const std::vector<int32_t> tokens = Iota(17, 1);
  ASSERT_TRUE(AdmitWhole(kv, 1, Iota(16, 1)));
  kv.Free(1);  // four cached blocks, released tail first
  ASSERT_TRUE(kv.AllocateSlots(2, {.token_ids = Iota(4, 500), .num_new_tokens = 1}));
  // The last block went; the first three still hit.
  EXPECT_EQ(kv.FindCachedPrefix(tokens, 0).num_tokens, 12);
  ExpectConsistent(kv);
}

TEST(KvCacheManagerTest, DuplicateComputationKeepsOnePublishedCopy) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 4});
  const std::vector<int32_t> tokens = Iota(9, 1);
  // Both admitted before either published anything: no hits, same content twice.
  const PrefixHit miss1 = kv.FindCachedPrefix(tokens, 0);
  const PrefixHit miss2 = kv.FindCachedPrefix(tokens, 0);
  ASSERT_TRUE(kv.AllocateSlots(1, {.token_ids = tokens, .num_new_tokens = 9,
                                   .prefix_hit = &miss1}));
  ASSERT_TRUE(kv.AllocateSlots(2, {.token_ids = tokens, .num_new_tokens = 9,
                                   .prefix_hit = &miss2}));
  EXPECT_TRUE(kv.pool().is_cached(kv.block_table(1)[0]));
  EXPECT_FALSE(kv.pool().is_cached(kv.block_table(2)[0]));
  ExpectConsistent(kv);
  kv.Free(2);
  kv.Free(1);
  EXPECT_EQ(kv.FindCachedPrefix(tokens, 0).num_tokens, 8);
  ExpectConsistent(kv);
}

TEST(KvCacheManagerTest, PrefixCachingCanBeTurnedOff) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = false});
  ASSERT_TRUE(AdmitWhole(kv, 1, Iota(9, 1)));
  EXPECT_FALSE(kv.pool().is_cached(kv.block_table(1)[0]));
  kv.Free(1);
  EXPECT_EQ(kv.FindCachedPrefix(Iota(9, 1), 0).num_tokens, 0);
  EXPECT_EQ(kv.pool().num_cached_free_blocks(), 0);
}

}  // namespace
}  // namespace moe
