#include "model/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>

#include "base/check.h"
#include "base/thread_pool.h"
#include "model/mlp.h"

namespace moe {
namespace {

// Rows of one wire format, packed for dispatch and unpacked per expert on arrival.
class WireRows {
 public:
  WireRows(ActivationWire wire, const float* x, int64_t tokens, int64_t hidden) : wire_(wire), hidden_(hidden) {
    switch (wire) {
      case ActivationWire::kF32:
        payloads_ = {{reinterpret_cast<const uint8_t*>(x), hidden * int64_t{sizeof(float)}}};
        break;
      case ActivationWire::kBF16:
        bf16_.resize(tokens * hidden);
        for (int64_t i = 0; i < tokens * hidden; ++i) bf16_[i] = F32ToBf16(x[i]);
        payloads_ = {{reinterpret_cast<const uint8_t*>(bf16_.data()), hidden * int64_t{sizeof(bf16)}}};
        break;
      case ActivationWire::kInt8:
        // What the expert's own GEMMs would have computed, once per token.
        q_.resize(tokens * hidden);
        scales_.resize(tokens);
        kernels::QuantizeRows(x, tokens, hidden, q_.data(), scales_.data());
        payloads_ = {{reinterpret_cast<const uint8_t*>(q_.data()), hidden},
                     {reinterpret_cast<const uint8_t*>(scales_.data()), sizeof(float)}};
        break;
    }
  }

  std::span<const RowPayload> payloads() const { return payloads_; }

  // y[i] = mlp(row rows[i] of `got`).
  void RunExpert(const MlpWeights& mlp, const DispatchedTokens& got, std::span<const int64_t> rows, float* y) const {
    const auto m = static_cast<int64_t>(rows.size());
    const int64_t row_bytes = payloads_[0].row_bytes;
    std::vector<uint8_t> gathered(m * row_bytes);
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(&gathered[i * row_bytes], &got.payloads[0][rows[i] * row_bytes], row_bytes);
    }
    if (wire_ == ActivationWire::kInt8) {
      std::vector<float> scales(m);
      for (int64_t i = 0; i < m; ++i) std::memcpy(&scales[i], &got.payloads[1][rows[i] * sizeof(float)], sizeof(float));
      MlpForwardQuantized(mlp, reinterpret_cast<const int8_t*>(gathered.data()), scales.data(), m, y);
      return;
    }
    if (wire_ == ActivationWire::kF32) {
      MlpForward(mlp, reinterpret_cast<const float*>(gathered.data()), m, y);
      return;
    }
    // BF16 -> F32 is exact, and the BF16 GEMM rounds these values to themselves.
    std::vector<float> f32(m * hidden_);
    const auto* b = reinterpret_cast<const bf16*>(gathered.data());
    for (int64_t i = 0; i < m * hidden_; ++i) f32[i] = Bf16ToF32(b[i]);
    MlpForward(mlp, f32.data(), m, y);
  }

 private:
  ActivationWire wire_;
  int64_t hidden_;
  std::vector<bf16> bf16_;
  std::vector<int8_t> q_;
  std::vector<float> scales_;
  std::vector<RowPayload> payloads_;
};

// Runs this rank's experts over the rows that arrived: each expert once over all rows that chose
// it. Returns, per row and slot, `hidden` floats (set where the slot's expert is this rank's).
std::vector<float> RunExperts(const ExpertPlacement& placement, const MoeWeights& moe, const WireRows& wire,
                              const DispatchedTokens& got, int64_t slots) {
  const int64_t hidden = moe.router.dim(1);
  const bool remote_shared = placement.shared_expert_ranks() > 0;
  const int64_t num_experts = placement.num_experts() + (remote_shared ? 1 : 0);
  std::vector<std::vector<int64_t>> slots_of(num_experts);  // row * slots + slot
  for (int64_t s = 0; s < got.rows * slots; ++s) {
    if (got.expert_ids[s] >= 0) slots_of[got.expert_ids[s]].push_back(s);
  }
  std::vector<int64_t> active;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (slots_of[e].empty()) continue;
    MOE_CHECK(e < placement.num_experts() || moe.shared, "shared-expert work reached a rank without the shared experts");
    active.push_back(e);
  }
  // Each expert whole on one thread, as LocalExpertBackend runs them.
  std::vector<float> results(got.rows * slots * hidden);
  ParallelFor(static_cast<int64_t>(active.size()), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> rows;
    std::vector<float> y;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t e = active[i];
      rows.clear();
      for (int64_t s : slots_of[e]) rows.push_back(s / slots);
      y.resize(rows.size() * hidden);
      wire.RunExpert(e == placement.num_experts() ? *moe.shared : moe.experts[e], got, rows, y.data());
      for (size_t r = 0; r < rows.size(); ++r) {
        std::memcpy(&results[slots_of[e][r] * hidden], &y[r * hidden], hidden * sizeof(float));
      }
    }
  });
  return results;
}

}  // namespace

ActivationWire WireFor(DType expert_dtype) {
  switch (expert_dtype) {
    case DType::kI8: return ActivationWire::kInt8;
    case DType::kBF16: return ActivationWire::kBF16;
    default: return ActivationWire::kF32;
  }
}

// One MoE layer's tokens on their way: dispatched at Start, run and combined at Finish.
class ExpertParallelBackend::Pending final : public PendingExperts {
 public:
  Pending(ExpertParallelBackend& backend, const MoeWeights& moe, const float* x, int64_t tokens,
          const int32_t* expert_ids, const float* weights, int64_t top_k)
      : backend_(backend),
        moe_(moe),
        x_(x),
        tokens_(tokens),
        hidden_(moe.router.dim(1)),
        remote_shared_(backend.placement_.shared_expert_ranks() > 0),
        slots_(top_k + (remote_shared_ ? 1 : 0)),
        wire_(backend.wire_, x, tokens, hidden_) {
    // With shared-expert ranks, a token's shared experts are one more slot, of weight 1 and the
    // highest id: the last term of its sum, as on one rank.
    ids_.reserve(tokens * slots_);
    slot_weights_.reserve(tokens * slots_);
    for (int64_t t = 0; t < tokens; ++t) {
      ids_.insert(ids_.end(), expert_ids + t * top_k, expert_ids + (t + 1) * top_k);
      slot_weights_.insert(slot_weights_.end(), weights + t * top_k, weights + (t + 1) * top_k);
      if (remote_shared_) {
        ids_.push_back(backend.placement_.shared_expert_id());
        slot_weights_.push_back(1.0f);
      }
    }
    Timed([&] {
      layout_ = backend_.dispatcher_.Layout(backend_.exchange_, ids_.data(), tokens, slots_);
      dispatch_ = backend_.dispatcher_.StartDispatch(layout_, wire_.payloads());
    });
  }

  void Finish(float* out) override {
    DispatchedTokens got;
    Timed([&] { got = dispatch_.Wait(); });
    const std::vector<float> results = RunExperts(backend_.placement_, moe_, wire_, got, slots_);
    std::vector<float> combined;
    Timed([&] { combined = backend_.dispatcher_.Combine(layout_, got, results.data(), hidden_); });

    // The same sum, in the same order, as LocalExpertBackend: ascending expert id.
    std::fill(out, out + tokens_ * hidden_, 0.0f);
    std::vector<int64_t> order(slots_);
    for (int64_t t = 0; t < tokens_; ++t) {
      const int32_t* token_ids = &ids_[t * slots_];
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return token_ids[a] < token_ids[b]; });
      float* dst = out + t * hidden_;
      for (int64_t j : order) {
        const float w = slot_weights_[t * slots_ + j];
        const float* src = &combined[(t * slots_ + j) * hidden_];
        for (int64_t d = 0; d < hidden_; ++d) dst[d] += w * src[d];
      }
    }
    if (!remote_shared_) AddSharedExperts(moe_, x_, tokens_, out);
  }

 private:
  void Timed(const std::function<void()>& exchange) {
    const auto start = std::chrono::steady_clock::now();
    exchange();
    backend_.exchange_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  ExpertParallelBackend& backend_;
  const MoeWeights& moe_;
  const float* x_;
  const int64_t tokens_, hidden_;
  const bool remote_shared_;
  const int64_t slots_;
  std::vector<int32_t> ids_;
  std::vector<float> slot_weights_;
  const WireRows wire_;
  MoeLayout layout_;
  PendingDispatch dispatch_;
};

std::unique_ptr<PendingExperts> ExpertParallelBackend::Start(const MoeWeights& moe, const float* x, int64_t tokens,
                                                             const int32_t* expert_ids, const float* weights,
                                                             int64_t top_k) {
  return std::make_unique<Pending>(*this, moe, x, tokens, expert_ids, weights, top_k);
}

}  // namespace moe
