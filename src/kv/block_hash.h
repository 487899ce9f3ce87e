// The identity of a full KV-cache block, for prefix caching. A block's latent KV depends on every
// token before it, so its hash chains over the whole prefix:
//   hash(block i) = HashBlock(hash(block i-1), salt, the block's token ids),
//   hash(block -1) = kRootBlockHash.
// `salt` carries anything else that changes the content for the same tokens (model or adapter id,
// a per-tenant cache salt that keeps tenants from probing each other's prompts).
//
// The function is written out here, not std::hash, so values are the same on every platform and
// build (a router or a KV store may compare hashes across processes). It folds 64-bit words into a
// state with splitmix64's finalizer (Steele, Lea and Flood, 2014), a bijection with full avalanche:
//   Fold(x, w) = Mix(x ^ (w + 0x9e3779b97f4a7c15))
//   h = Fold(Fold(parent, salt), number of tokens); then h = Fold(h, token) for each token
// (tokens as unsigned 32-bit values). With 64-bit hashes the chance that any two of N distinct
// cached blocks collide is about N^2 / 2^65: 3e-8 for a million blocks.
#pragma once

#include <cstdint>
#include <span>

namespace moe {

using BlockHash = uint64_t;

inline constexpr BlockHash kRootBlockHash = 0;

BlockHash HashBlock(BlockHash parent, uint64_t salt, std::span<const int32_t> token_ids);

}  // namespace moe
