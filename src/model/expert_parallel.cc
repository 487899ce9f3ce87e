#include "model/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "model/mlp.h"

namespace moe {

void ExpertParallelBackend::Run(const MoeWeights& moe, const float* x, int64_t tokens, const int32_t* expert_ids,
                                const float* weights, int64_t top_k, float* out) {
  const int64_t hidden = moe.router.dim(1);
  const bool int8 = int8_;
  const MoeLayout layout = dispatcher_.Layout(exchange_, expert_ids, tokens, top_k);

  // A8W8 experts take their input as INT8 rows and scales, quantized here once per token: what
  // the expert's own GEMMs would have computed, at about half the bytes of BF16.
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<RowPayload> payloads;
  if (int8) {
    q.resize(tokens * hidden);
    scales.resize(tokens);
    kernels::QuantizeRows(x, tokens, hidden, q.data(), scales.data());
    payloads = {{reinterpret_cast<const uint8_t*>(q.data()), hidden},
                {reinterpret_cast<const uint8_t*>(scales.data()), sizeof(float)}};
  } else {
    payloads = {{reinterpret_cast<const uint8_t*>(x), hidden * int64_t{sizeof(float)}}};
  }
  const DispatchedTokens got = dispatcher_.Dispatch(layout, payloads);

  // Each expert of this rank runs once over all the rows that chose it.
  std::vector<std::vector<int64_t>> slots_of(moe.experts.size());  // row * top_k + slot
  for (int64_t s = 0; s < got.rows * top_k; ++s) {
    if (got.expert_ids[s] >= 0) slots_of[got.expert_ids[s]].push_back(s);
  }
  std::vector<float> results(got.rows * top_k * hidden);
  std::vector<int8_t> rows_q;
  std::vector<float> rows_scales, rows_f32, y;
  for (size_t e = 0; e < slots_of.size(); ++e) {
    const auto& slots = slots_of[e];
    if (slots.empty()) continue;
    const auto m = static_cast<int64_t>(slots.size());
    y.resize(m * hidden);
    if (int8) {
      rows_q.resize(m * hidden);
      rows_scales.resize(m);
      for (int64_t i = 0; i < m; ++i) {
        const int64_t row = slots[i] / top_k;
        std::memcpy(&rows_q[i * hidden], &got.payloads[0][row * hidden], hidden);
        std::memcpy(&rows_scales[i], &got.payloads[1][row * sizeof(float)], sizeof(float));
      }
      MlpForwardQuantized(moe.experts[e], rows_q.data(), rows_scales.data(), m, y.data());
    } else {
      rows_f32.resize(m * hidden);
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(&rows_f32[i * hidden], &got.payloads[0][(slots[i] / top_k) * hidden * sizeof(float)],
                    hidden * sizeof(float));
      }
      MlpForward(moe.experts[e], rows_f32.data(), m, y.data());
    }
    for (int64_t i = 0; i < m; ++i) std::memcpy(&results[slots[i] * hidden], &y[i * hidden], hidden * sizeof(float));
  }
  const std::vector<float> combined = dispatcher_.Combine(layout, got, results.data(), hidden);

  // The same sum, in the same order, as LocalExpertBackend: ascending expert id.
  std::fill(out, out + tokens * hidden, 0.0f);
  std::vector<int64_t> order(top_k);
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t* ids = expert_ids + t * top_k;
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    float* dst = out + t * hidden;
    for (int64_t j : order) {
      const float w = weights[t * top_k + j];
      const float* src = &combined[(t * top_k + j) * hidden];
      for (int64_t d = 0; d < hidden; ++d) dst[d] += w * src[d];
    }
  }
}

}  // namespace moe
