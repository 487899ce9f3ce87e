#include "kv/block_pool.h"

#include <vector>

#include <gtest/gtest.h>

#include "kv/block_hash.h"

namespace moe {
namespace {

void ExpectConsistent(const BlockPool& pool) {
  const Status status = pool.CheckInvariants();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST(BlockHashTest, IsStableAcrossBuilds) {
  // Pinned (and matched by a Python transcription of the formula in block_hash.h): hashes may be
  // compared across processes, so changing the function must be deliberate.
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  EXPECT_EQ(HashBlock(kRootBlockHash, 0, tokens), 0xe340ba9f5934491eULL);
}

TEST(BlockHashTest, DependsOnParentSaltTokensAndOrder) {
  const std::vector<int32_t> tokens = {5, 6, 7, 8};
  const BlockHash h = HashBlock(kRootBlockHash, 0, tokens);
  EXPECT_EQ(h, HashBlock(kRootBlockHash, 0, tokens));
  EXPECT_NE(h, HashBlock(h, 0, tokens));  // same tokens, different prefix
  EXPECT_NE(h, HashBlock(kRootBlockHash, 1, tokens));
  EXPECT_NE(h, HashBlock(kRootBlockHash, 0, std::vector<int32_t>{5, 6, 8, 7}));
  EXPECT_NE(h, HashBlock(kRootBlockHash, 0, std::vector<int32_t>{5, 6, 7, 9}));
  EXPECT_NE(h, HashBlock(kRootBlockHash, 0, std::vector<int32_t>{5, 6, 7}));
  EXPECT_NE(HashBlock(kRootBlockHash, 0, std::vector<int32_t>{0}),
            HashBlock(kRootBlockHash, 0, std::vector<int32_t>{0, 0}));
}

TEST(BlockHashTest, ChainIdentifiesTheWholePrefix) {
  const std::vector<int32_t> a = {1, 2}, b = {3, 4}, c = {9, 9};
  // Two sequences that share their second block but not their first.
  const BlockHash ab = HashBlock(HashBlock(kRootBlockHash, 0, a), 0, b);
  const BlockHash cb = HashBlock(HashBlock(kRootBlockHash, 0, c), 0, b);
  EXPECT_NE(ab, cb);
  EXPECT_EQ(ab, HashBlock(HashBlock(kRootBlockHash, 0, a), 0, b));
}

TEST(BlockPoolTest, AllocatesAndReleasesWithRefCounts) {
  BlockPool pool(3);
  EXPECT_EQ(pool.num_free_blocks(), 3);
  const BlockId a = pool.Allocate();
  const BlockId b = pool.Allocate();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(pool.ref_count(a), 1);
  ASSERT_TRUE(pool.Cache(a, 42));
  pool.AddRef(a);  // a second request shares it
  EXPECT_EQ(pool.ref_count(a), 2);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  pool.Release(a);
  EXPECT_EQ(pool.ref_count(a), 1);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  pool.Release(a);
  pool.Release(b);
  EXPECT_EQ(pool.num_free_blocks(), 3);
  EXPECT_EQ(pool.num_cached_free_blocks(), 1);  // a keeps its content
  EXPECT_EQ(pool.FindCached(42), a);
  ExpectConsistent(pool);
}

TEST(BlockPoolTest, EmptyBlocksGoBeforeCachedOnes) {
  BlockPool pool(2);
  const BlockId cached = pool.Allocate();
  const BlockId plain = pool.Allocate();
  ASSERT_TRUE(pool.Cache(cached, 7));
  pool.Release(cached);
  pool.Release(plain);
  EXPECT_EQ(pool.Allocate(), plain);
  EXPECT_EQ(pool.FindCached(7), cached);
  EXPECT_EQ(pool.Allocate(), cached);  // only now evicted
  EXPECT_FALSE(pool.FindCached(7).has_value());
  EXPECT_FALSE(pool.is_cached(cached));
  ExpectConsistent(pool);
}

TEST(BlockPoolTest, EvictsLeastRecentlyUsedFirst) {
  BlockPool pool(3);
  std::vector<BlockId> blocks;
  for (BlockHash hash = 1; hash <= 3; ++hash) {
    blocks.push_back(pool.Allocate());
    ASSERT_TRUE(pool.Cache(blocks.back(), hash));
  }
  for (BlockId block : blocks) pool.Release(block);  // LRU order: hash 1, 2, 3
  // A prefix hit on hash 1 and its release make it the most recently used.
  pool.AddRef(*pool.FindCached(1));
  EXPECT_EQ(pool.num_free_blocks(), 2);
  pool.Release(*pool.FindCached(1));
  EXPECT_EQ(pool.Allocate(), blocks[1]);
  EXPECT_FALSE(pool.FindCached(2).has_value());
  EXPECT_EQ(pool.Allocate(), blocks[2]);
  EXPECT_EQ(pool.FindCached(1), blocks[0]);
  EXPECT_EQ(pool.Allocate(), blocks[0]);
  EXPECT_EQ(pool.num_free_blocks(), 0);
  ExpectConsistent(pool);
}

TEST(BlockPoolTest, DuplicateContentStaysUnpublished) {
  BlockPool pool(2);
  const BlockId first = pool.Allocate();
  const BlockId second = pool.Allocate();
  EXPECT_TRUE(pool.Cache(first, 5));
  EXPECT_FALSE(pool.Cache(second, 5));
  EXPECT_EQ(pool.FindCached(5), first);
  pool.Release(second);
  EXPECT_EQ(pool.num_cached_free_blocks(), 0);  // nothing to keep: it went back empty
  ExpectConsistent(pool);
}

TEST(BlockPoolDeathTest, MisuseIsCaught) {
  BlockPool pool(1);
  EXPECT_DEATH(pool.Release(0), "unreferenced");
  EXPECT_DEATH(pool.AddRef(0), "empty block");
  pool.Allocate();
  EXPECT_DEATH(pool.Allocate(), "no free block");
  EXPECT_DEATH(pool.ref_count(1), "outside");
}

}  // namespace
}  // namespace moe
