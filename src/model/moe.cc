#include "model/moe.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "base/int_math.h"
#include "base/thread_pool.h"
#include "kernels/kernels.h"
#include "model/mlp.h"

namespace moe {
namespace {

// Indices of the `k` largest values, largest first, ties to the lower index.
std::vector<int32_t> TopK(const std::vector<double>& values, int64_t k) {
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  order.resize(k);
  return order;
}

std::vector<double> Scores(const ModelConfig& c, const float* logits) {
  const int64_t n = c.n_routed_experts;
  std::vector<double> s(logits, logits + n);
  if (c.scoring_func == ScoringFunc::kSigmoid) {
    for (double& v : s) v = 1.0 / (1.0 + std::exp(-v));
  } else {
    const double max = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& v : s) sum += (v = std::exp(v - max));
    for (double& v : s) v /= sum;
  }
  return s;
}

// Sets the selection scores of experts outside the best `topk_group` groups to -inf.
void MaskGroups(const ModelConfig& c, std::vector<double>& selection) {
  const int64_t per_group = c.n_routed_experts / c.n_group;
  std::vector<double> group_scores(c.n_group);
  for (int64_t g = 0; g < c.n_group; ++g) {
    std::vector<double> members(selection.begin() + g * per_group, selection.begin() + (g + 1) * per_group);
    if (c.topk_method == TopkMethod::kNoauxTc) {
      const std::vector<int32_t> best = TopK(members, 2);
      group_scores[g] = members[best[0]] + members[best[1]];
    } else {
      group_scores[g] = *std::max_element(members.begin(), members.end());
    }
  }
  std::vector<bool> keep(c.n_group, false);
  for (int32_t g : TopK(group_scores, c.topk_group)) keep[g] = true;
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    if (!keep[e / per_group]) selection[e] = -std::numeric_limits<double>::infinity();
  }
}

// One token's experts and weights from its router logits.
void RouteToken(const ModelConfig& c, const float* logits, const float* score_bias, int32_t* expert_ids,
                float* weights) {
  const int64_t n = c.n_routed_experts, k = c.num_experts_per_tok;
  const std::vector<double> scores = Scores(c, logits);
  std::vector<double> selection = scores;
  if (score_bias) {
    for (int64_t e = 0; e < n; ++e) selection[e] += score_bias[e];
  }
  if (c.topk_method != TopkMethod::kGreedy && c.n_group > 1) MaskGroups(c, selection);
  const std::vector<int32_t> chosen = TopK(selection, k);
  double sum = 0;
  for (int32_t e : chosen) sum += scores[e];
  const double norm = c.norm_topk_prob ? sum : 1.0;
  for (int64_t j = 0; j < k; ++j) {
    expert_ids[j] = chosen[j];
    weights[j] = static_cast<float>(scores[chosen[j]] / norm * c.routed_scaling_factor);
  }
}

}  // namespace

void Route(const ModelConfig& c, const float* logits, const float* score_bias, int64_t tokens,
           int32_t* expert_ids, float* weights) {
  const int64_t n = c.n_routed_experts, k = c.num_experts_per_tok;
  ParallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      RouteToken(c, logits + t * n, score_bias, expert_ids + t * k, weights + t * k);
    }
  });
}

namespace {

// The shared experts of a step's tokens where they run by blocks of columns
// (kernels::MatmulRunsByBlocks: INT8, a few rows), handed out as units of work after the routed
// experts': their gate's and up's units, then their down projection's, in the same loop, so that
// the step has one parallel loop of experts a layer, not two. The same bits as MlpForward: the
// blocks' columns are those MatmulQuantized gives, and SiLU's output is quantized as Matmul
// quantizes it.
class SharedBlocks {
 public:
  // `tokens` 0: no units (the shared experts run on their own, AddSharedExperts).
  SharedBlocks(const MoeWeights& moe, int64_t tokens) : tokens_(tokens) {
    if (tokens == 0 || !moe.shared) return;
    const MlpWeights& w = *moe.shared;
    for (const Linear* l : {&w.gate, &w.up, &w.down}) {
      if (!kernels::MatmulRunsByBlocks(tokens, l->view())) return;
    }
    w_ = &w;
    gate_units_ = Units(w.gate);
    up_units_ = Units(w.up);
    down_units_ = Units(w.down);
    gate_ = std::make_unique_for_overwrite<float[]>(tokens * w.gate.rows());
    up_ = std::make_unique_for_overwrite<float[]>(tokens * w.up.rows());
    act_ = std::make_unique_for_overwrite<int8_t[]>(tokens * w.gate.rows());
    act_scales_ = std::make_unique_for_overwrite<float[]>(tokens);
    out_ = std::make_unique_for_overwrite<float[]>(tokens * w.down.rows());
  }

  // The gate's and up's units, and the down projection's, to be handed out in that order.
  int64_t leading_units() const { return gate_units_ + up_units_; }
  int64_t trailing_units() const { return down_units_; }

  // Unit u of the gate's, then the up's, from the tokens quantized (QuantizeRows). The thread that
  // ends the last of them makes the down projection's input.
  void RunLeadingUnit(int64_t u, const int8_t* x, const float* x_scales) {
    const bool gate = u < gate_units_;
    RunBlocks(gate ? w_->gate : w_->up, gate ? u : u - gate_units_, x, x_scales, gate ? gate_.get() : up_.get());
    if (leading_done_.fetch_add(1, std::memory_order_acq_rel) + 1 < leading_units()) return;
    const int64_t width = w_->gate.rows();
    kernels::SiluMul(gate_.get(), up_.get(), tokens_ * width, gate_.get());
    kernels::QuantizeRows(gate_.get(), tokens_, width, act_.get(), act_scales_.get());
    act_ready_.store(true, std::memory_order_release);
  }

  // Unit u of the down projection, once its input is made: at once, or after the other thread's
  // last leading unit (every leading unit was handed out before any trailing one, so one is
  // running).
  void RunTrailingUnit(int64_t u) {
    while (!act_ready_.load(std::memory_order_acquire)) std::this_thread::yield();
    RunBlocks(w_->down, u, act_.get(), act_scales_.get(), out_.get());
  }

  // Once every unit has run: the shared experts' output, [tokens, hidden].
  const float* out() const { return out_.get(); }

 private:
  // Four blocks a unit, as many as Int8Gemv reads side by side at one row: bench-3b's shared gate
  // and up are 8 units of 512 KiB, its down 8 of 256 KiB.
  static constexpr int64_t kUnitBlocks = 4;
  static int64_t Units(const Linear& l) {
    return CeilDiv(CeilDiv(l.rows(), kernels::kMatmulColumnBlock), kUnitBlocks);
  }
  void RunBlocks(const Linear& l, int64_t unit, const int8_t* x, const float* x_scales, float* y) const {
    const int64_t begin = unit * kUnitBlocks;
    const int64_t end = std::min(begin + kUnitBlocks, CeilDiv(l.rows(), kernels::kMatmulColumnBlock));
    kernels::MatmulQuantizedBlocks(x, x_scales, tokens_, l.view(), begin, end, y);
  }

  int64_t tokens_;
  const MlpWeights* w_ = nullptr;
  int64_t gate_units_ = 0, up_units_ = 0, down_units_ = 0;
  std::unique_ptr<float[]> gate_, up_, act_scales_, out_;
  std::unique_ptr<int8_t[]> act_;
  std::atomic<int64_t> leading_done_ = 0;
  std::atomic<bool> act_ready_ = false;
};

class LocalPending final : public PendingExperts {
 public:
  LocalPending(const MoeWeights& moe, const float* x, int64_t tokens, const int32_t* expert_ids, const float* weights,
               int64_t top_k)
      : moe_(moe), x_(x), tokens_(tokens), top_k_(top_k), assigned_(moe.experts.size()) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < top_k; ++j) assigned_[expert_ids[t * top_k + j]].push_back({t, weights[t * top_k + j]});
    }
  }

  void Finish(float* out) override {
    const int64_t hidden = moe_.router.dim(1);
    // The experts with tokens, and where each one's results start (in rows).
    std::vector<int64_t> active, first;
    int64_t total = 0;
    for (size_t e = 0; e < assigned_.size(); ++e) {
      if (assigned_[e].empty()) continue;
      active.push_back(static_cast<int64_t>(e));
      first.push_back(total);
      total += static_cast<int64_t>(assigned_[e].size());
    }
    // INT8 experts take each token quantized once, not once per expert it goes to.
    const bool int8 = !active.empty() && moe_.experts[active[0]].gate.dtype == DType::kI8;
    std::vector<int8_t> x_int8(int8 ? tokens_ * hidden : 0);
    std::vector<float> x_scales(int8 ? tokens_ : 0);
    if (int8) kernels::QuantizeRows(x_, tokens_, hidden, x_int8.data(), x_scales.data());
    SharedBlocks shared(moe_, int8 ? tokens_ : 0);
    // Each expert whole on one thread (an expert gets a few rows each step, too little work to
    // split its GEMMs across threads), each thread taking the next expert when it is free, those
    // with the most rows first: fixed halves left one thread waiting ~0.9 ms a layer at 32
    // sequences, half of it from the cores' speeds changing under the machine's other tenants.
    // Then the shared expert in blocks of columns (SharedBlocks), so that the thread whose last
    // routed expert ends first has work while the other finishes its own.
    const auto results = std::make_unique_for_overwrite<float[]>(total * hidden);
    std::vector<int64_t> order(active.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return assigned_[active[a]].size() > assigned_[active[b]].size(); });
    const auto routed = static_cast<int64_t>(order.size());
    const int64_t leading = shared.leading_units();
    ParallelForEach(leading + routed + shared.trailing_units(), [&](int64_t claimed) {
      if (claimed >= routed + leading) return shared.RunTrailingUnit(claimed - routed - leading);
      if (claimed >= routed) return shared.RunLeadingUnit(claimed - routed, x_int8.data(), x_scales.data());
      const int64_t i = order[claimed];
      const auto& batch = assigned_[active[i]];
      const auto m = static_cast<int64_t>(batch.size());
      float* y = results.get() + first[i] * hidden;
      if (int8) {
        std::vector<int8_t> rows(m * hidden);
        std::vector<float> scales(m);
        for (int64_t r = 0; r < m; ++r) {
          std::memcpy(&rows[r * hidden], &x_int8[batch[r].first * hidden], hidden);
          scales[r] = x_scales[batch[r].first];
        }
        MlpForwardQuantized(moe_.experts[active[i]], rows.data(), scales.data(), m, y);
        return;
      }
      std::vector<float> rows(m * hidden);
      for (int64_t r = 0; r < m; ++r) {
        std::memcpy(&rows[r * hidden], x_ + batch[r].first * hidden, hidden * sizeof(float));
      }
      MlpForward(moe_.experts[active[i]], rows.data(), m, y);
    });
    const float* shared_out = shared.leading_units() > 0 ? shared.out() : nullptr;
    // Each token's sum in ascending expert order, then the shared experts' term; threads split the
    // tokens, so a token's row stays in cache while its experts' results pass through it once.
    std::vector<std::pair<int64_t, float>> sources(tokens_ * top_k_);  // per token: (result row, weight)
    std::vector<int64_t> filled(tokens_, 0);
    for (size_t i = 0; i < active.size(); ++i) {
      const auto& batch = assigned_[active[i]];
      for (size_t r = 0; r < batch.size(); ++r) {
        const int64_t t = batch[r].first;
        sources[t * top_k_ + filled[t]++] = {first[i] + static_cast<int64_t>(r), batch[r].second};
      }
    }
    ParallelFor(tokens_, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* dst = out + t * hidden;
        std::fill(dst, dst + hidden, 0.0f);
        for (int64_t j = 0; j < filled[t]; ++j) {
          const auto [row, weight] = sources[t * top_k_ + j];
          const float* src = results.get() + row * hidden;
          for (int64_t d = 0; d < hidden; ++d) dst[d] += weight * src[d];
        }
        if (shared_out) {
          for (int64_t d = 0; d < hidden; ++d) dst[d] += shared_out[t * hidden + d];
        }
      }
    });
    if (!shared_out) AddSharedExperts(moe_, x_, tokens_, out);
  }

 private:
  const MoeWeights& moe_;
  const float* x_;
  int64_t tokens_;
  int64_t top_k_;
  std::vector<std::vector<std::pair<int64_t, float>>> assigned_;  // per expert: (token, weight)
};

}  // namespace

std::unique_ptr<PendingExperts> LocalExpertBackend::Start(const MoeWeights& moe, const float* x, int64_t tokens,
                                                          const int32_t* expert_ids, const float* weights,
                                                          int64_t top_k) {
  return std::make_unique<LocalPending>(moe, x, tokens, expert_ids, weights, top_k);
}

void AddSharedExperts(const MoeWeights& w, const float* x, int64_t tokens, float* out) {
  if (!w.shared) return;
  const int64_t hidden = w.router.dim(1);
  const auto shared = std::make_unique_for_overwrite<float[]>(tokens * hidden);
  MlpForward(*w.shared, x, tokens, shared.get());
  ParallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * hidden; i < end * hidden; ++i) out[i] += shared[i];
  });
}

std::unique_ptr<PendingExperts> StartMoe(const MoeWeights& w, const ModelConfig& c, ExpertBackend& experts,
                                         const float* x, int64_t tokens) {
  const int64_t k = c.num_experts_per_tok;
  std::vector<float> logits(tokens * c.n_routed_experts);
  // F32, in an order that does not depend on the batch: a token's experts must not either.
  kernels::BatchInvariantMatmul(x, tokens, w.router.view(), logits.data());
  std::vector<int32_t> ids(tokens * k);
  std::vector<float> weights(tokens * k);
  Route(c, logits.data(), w.score_bias.empty() ? nullptr : w.score_bias.data<float>(), tokens, ids.data(),
        weights.data());
  return experts.Start(w, x, tokens, ids.data(), weights.data(), k);
}

}  // namespace moe
