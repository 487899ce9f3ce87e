#include "engine/expert_load.h"

namespace moe {

std::unique_ptr<PendingExperts> ExpertLoadCounter::Start(const MoeWeights& moe, const float* x, int64_t tokens,
                                                         const int32_t* expert_ids, const float* weights,
                                                         int64_t top_k) {
  {
    std::lock_guard lock(mutex_);
    auto [it, added] = slot_of_.try_emplace(&moe, loads_.size());
    if (added) {
      loads_.push_back({first_moe_layer_ + static_cast<int64_t>(it->second),
                        std::vector<int64_t>(moe.experts.size(), 0)});
    }
    std::vector<int64_t>& counts = loads_[it->second].tokens_per_expert;
    for (int64_t i = 0; i < tokens * top_k; ++i) ++counts[expert_ids[i]];
  }
  return inner_.Start(moe, x, tokens, expert_ids, weights, top_k);
}

std::vector<ExpertLoadCounter::LayerLoad> ExpertLoadCounter::Snapshot() const {
  std::lock_guard lock(mutex_);
  return loads_;
}

}  // namespace moe
