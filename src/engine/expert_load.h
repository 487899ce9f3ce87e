// Counts how many tokens each routed expert of each MoE layer receives, for monitoring and for
// placing experts by load. It wraps the backend that runs them, so it sees every routing decision
// without the model knowing.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "model/moe.h"

namespace moe {

class ExpertLoadCounter final : public ExpertBackend {
 public:
  // `first_moe_layer` is the index of the first MoE decoder layer (the config's
  // first_k_dense_replace): MoE layers are numbered from it in the order the model first runs them,
  // which is layer order (the MTP layer, run after the main model, comes last).
  ExpertLoadCounter(ExpertBackend& inner, int64_t first_moe_layer) : inner_(inner), first_moe_layer_(first_moe_layer) {}

  std::unique_ptr<PendingExperts> Start(const MoeWeights& moe, const float* x, int64_t tokens,
                                        const int32_t* expert_ids, const float* weights, int64_t top_k) override;
  int micro_batches() const override { return inner_.micro_batches(); }

  double exchange_seconds() const override { return inner_.exchange_seconds(); }

  struct LayerLoad {
    int64_t layer = 0;
    std::vector<int64_t> tokens_per_expert;
  };
  // A copy: safe to call from another thread than the one running the model.
  std::vector<LayerLoad> Snapshot() const;

 private:
  ExpertBackend& inner_;
  const int64_t first_moe_layer_;
  mutable std::mutex mutex_;
  std::unordered_map<const MoeWeights*, size_t> slot_of_;
  std::vector<LayerLoad> loads_;
};

}  // namespace moe
