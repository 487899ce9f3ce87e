// The MoE block: routing, then the experts (routed and shared) through an ExpertBackend.
#pragma once

#include <cstdint>
#include <memory>

#include "model/config.h"
#include "model/weights.h"

namespace moe {

// Chooses num_experts_per_tok experts per token from router logits [tokens, n_routed_experts]
// by the config's scoring function and top-k method; writes expert_ids and their weights
// ([tokens, num_experts_per_tok] each). `score_bias` (noaux_tc only, may be null) steers
// selection but never the weights. Ties go to the lower expert index.
void Route(const ModelConfig& config, const float* logits, const float* score_bias, int64_t tokens,
           int32_t* expert_ids, float* weights);

// Experts started and not yet finished: Finish writes their result.
class PendingExperts {
 public:
  virtual ~PendingExperts() = default;
  virtual void Finish(float* out) = 0;
};

// Runs the experts of an MoE block. The model calls experts only through this, so that expert
// parallelism can replace where they run without touching the model.
class ExpertBackend {
 public:
  virtual ~ExpertBackend() = default;
  // Starts the experts of `tokens` rows of x (where they run elsewhere: sends the rows), to be
  // finished later, in the order started; routing is read now, x until Finish. Finish writes
  // out[t] = sum_j weights[t, j] * expert_{expert_ids[t, j]}(x[t]) for t < tokens, j < top_k, in
  // ascending expert order, then + shared(x[t]) when the layer has shared experts.
  virtual std::unique_ptr<PendingExperts> Start(const MoeWeights& moe, const float* x, int64_t tokens,
                                                const int32_t* expert_ids, const float* weights, int64_t top_k) = 0;
  void Run(const MoeWeights& moe, const float* x, int64_t tokens, const int32_t* expert_ids, const float* weights,
           int64_t top_k, float* out) {
    Start(moe, x, tokens, expert_ids, weights, top_k)->Finish(out);
  }
  // How many micro-batches the model should split a step into, starting the experts of each
  // before finishing any, so that one's exchange travels while another computes (two-batch
  // overlap); 1 runs the batch whole.
  virtual int micro_batches() const { return 1; }
  // Wall time spent moving tokens between ranks so far: zero when every expert is local.
  virtual double exchange_seconds() const { return 0; }
};

// Every expert in this process. Tokens are grouped by expert so each expert runs one GEMM; each
// token's results are summed in ascending expert order, so a token's output does not depend on
// which other tokens share its batch.
class LocalExpertBackend final : public ExpertBackend {
 public:
  std::unique_ptr<PendingExperts> Start(const MoeWeights& moe, const float* x, int64_t tokens,
                                        const int32_t* expert_ids, const float* weights, int64_t top_k) override;
};

// Adds the layer's shared experts of x to out (nothing when it has none): the last term of a
// token's sum.
void AddSharedExperts(const MoeWeights& w, const float* x, int64_t tokens, float* out);

// Routes x (already normalized) and starts its experts; Finish writes out[tokens, hidden] =
// routed experts + shared experts of x. x must stay valid until then.
std::unique_ptr<PendingExperts> StartMoe(const MoeWeights& w, const ModelConfig& config, ExpertBackend& experts,
                                         const float* x, int64_t tokens);

}  // namespace moe
