// Expert parallelism: routed experts spread over the ranks of an instance. Each rank runs its own
// tokens' attention (data parallel) and hands their MoE work to this backend, which sends every
// token to the ranks that own its experts, runs the experts that arrived here, and brings the
// outputs home, where they are summed exactly as LocalExpertBackend sums them: results are
// bit-identical for any number of ranks. Shared experts run on every rank, or on dedicated
// shared-expert ranks as one more expert slot per token (the placement says which).
#pragma once

#include "dist/moe_dispatch.h"
#include "model/moe.h"
#include "tensor/dtype.h"

namespace moe {

// How a token's activations travel: as what the experts' first GEMMs make of them anyway (INT8
// rows and a scale for A8W8, BF16 for BF16 weights), so the bytes shrink and no result changes.
enum class ActivationWire { kF32, kBF16, kInt8 };
ActivationWire WireFor(DType expert_dtype);

class ExpertParallelBackend final : public ExpertBackend {
 public:
  // Every rank of `comm` must start and finish experts for every MoE layer, in the same order,
  // with tokens = 0 when it has none. `micro_batches` (1 or 2) is what micro_batches() tells the
  // model: 2 overlaps one micro-batch's exchange with the other's attention and experts.
  ExpertParallelBackend(Communicator& comm, ExpertPlacement placement, MoeExchange exchange, ActivationWire wire,
                        int micro_batches = 1)
      : placement_(std::move(placement)),
        dispatcher_(comm, placement_),
        exchange_(exchange),
        wire_(wire),
        micro_batches_(micro_batches) {}

  std::unique_ptr<PendingExperts> Start(const MoeWeights& moe, const float* x, int64_t tokens,
                                        const int32_t* expert_ids, const float* weights, int64_t top_k) override;
  int micro_batches() const override { return micro_batches_; }

  const ExpertPlacement& placement() const { return placement_; }
  // Layouts, dispatches and combines, waiting for other ranks included.
  double exchange_seconds() const override { return exchange_seconds_; }

 private:
  class Pending;

  ExpertPlacement placement_;
  MoeDispatcher dispatcher_;
  MoeExchange exchange_;
  ActivationWire wire_;
  int micro_batches_;
  double exchange_seconds_ = 0;
};

}  // namespace moe
