// Expert parallelism: routed experts spread over the ranks of an instance. Each rank runs its own
// tokens' attention (data parallel) and hands their MoE work to this backend, which sends every
// token to the ranks that own its experts, runs the experts that arrived here, and brings the
// outputs home, where they are summed exactly as LocalExpertBackend sums them: results are
// bit-identical for any number of ranks.
#pragma once

#include "dist/moe_dispatch.h"
#include "model/moe.h"

namespace moe {

class ExpertParallelBackend final : public ExpertBackend {
 public:
  // Every rank of `comm` must call Run for every MoE layer, in the same order, with tokens = 0
  // when it has none.
  // `int8_activations`: the experts are I8 (A8W8), so tokens travel as INT8 rows and scales.
  ExpertParallelBackend(Communicator& comm, ExpertPlacement placement, MoeExchange exchange, bool int8_activations)
      : placement_(std::move(placement)), dispatcher_(comm, placement_), exchange_(exchange), int8_(int8_activations) {}

  void Run(const MoeWeights& moe, const float* x, int64_t tokens, const int32_t* expert_ids, const float* weights,
           int64_t top_k, float* out) override;

  const ExpertPlacement& placement() const { return placement_; }

 private:
  ExpertPlacement placement_;
  MoeDispatcher dispatcher_;
  MoeExchange exchange_;
  bool int8_;
};

}  // namespace moe
