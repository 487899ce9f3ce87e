#include "kv/block_hash.h"

namespace moe {
namespace {

// splitmix64's output function.
uint64_t Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Adding the golden-ratio constant keeps a zero word from leaving a zero state at zero.
uint64_t Fold(uint64_t state, uint64_t word) { return Mix(state ^ (word + 0x9e3779b97f4a7c15ULL)); }

}  // namespace

BlockHash HashBlock(BlockHash parent, uint64_t salt, std::span<const int32_t> token_ids) {
  uint64_t h = Fold(Fold(parent, salt), token_ids.size());
  for (int32_t token : token_ids) h = Fold(h, static_cast<uint32_t>(token));
  return h;
}

}  // namespace moe
