// Route (noaux_tc, sigmoid scoring) for DeepSeek-V3's 256 experts and the bench model's 64.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench.h"
#include "model/moe.h"
#include "roofline.h"

namespace moe::bench {
namespace {

ModelConfig RouterConfig(int64_t experts) {
  ModelConfig c;
  c.n_routed_experts = experts;
  c.num_experts_per_tok = 8;
  c.n_group = 8;
  c.topk_group = 4;
  c.routed_scaling_factor = 2.5;
  return c;
}

void BM_Route(benchmark::State& state, int64_t experts) {
  const ModelConfig config = RouterConfig(experts);
  const int64_t tokens = state.range(0), top_k = config.num_experts_per_tok;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(tokens * experts), bias(experts);
  for (float& v : logits) v = dist(rng);
  for (float& v : bias) v = 0.1f * dist(rng);
  std::vector<int32_t> ids(tokens * top_k);
  std::vector<float> weights(tokens * top_k);
  for (auto _ : state) {
    Route(config, logits.data(), bias.data(), tokens, ids.data(), weights.data());
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetItemsProcessed(state.iterations() * tokens);  // tokens routed per second
}

}  // namespace

void RegisterRoutingBenchmarks() {
  for (int64_t experts : {256, 64}) {
    const std::string name = "Route/experts:" + std::to_string(experts);
    benchmark::RegisterBenchmark(name.c_str(), BM_Route, experts)
        ->ArgName("tokens")->Arg(1)->Arg(64)->Arg(512)->UseRealTime()->MinTime(0.05);
  }
}

}  // namespace moe::bench
