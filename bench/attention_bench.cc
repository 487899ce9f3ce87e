// Decode attention in the absorbed MLA form over the latent cache: one token, 16 heads (the bench
// model's), kv_lora 512 and rope 64 (DeepSeek-V3's), an F32 or a BF16 cache, AMLA or the plain
// rescale. Each call reads its cache from memory (see cold.h), as a decode step does.
// Prompt attention in the expanded form: a whole prompt of 512 or 2048 tokens, 16 heads of qk 192
// and v 128, with F32 or BF16 products; compute-bound, so against the F32 or BF16 peak.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/cpu_features.h"
#include "base/thread_pool.h"
#include "bench.h"
#include "cold.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/latent_attention.h"
#include "kernels/kernels.h"
#include "roofline.h"

namespace moe::bench {
namespace {

constexpr int64_t kHeads = 16, kLora = 512, kRope = 64;

template <typename T>
std::vector<T> RandomCache(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<T> v(n);
  for (T& x : v) {
    if constexpr (std::is_same_v<T, bf16>) {
      x = F32ToBf16(dist(rng));
    } else {
      x = dist(rng);
    }
  }
  return v;
}

template <typename T>
void BM_LatentAttention(benchmark::State& state, kernels::SoftmaxRescale rescale, kernels::cpu::Isa isa) {
  const int64_t keys = state.range(0);
  std::mt19937 rng(7);
  const std::vector<float> q_lat = RandomCache<float>(kHeads * kLora, rng);
  const std::vector<float> q_pe = RandomCache<float>(kHeads * kRope, rng);
  Rotation<T> c_kv(RandomCache<T>(keys * kLora, rng)), k_pe(RandomCache<T>(keys * kRope, rng));
  std::vector<float> out(kHeads * kLora);
  // The softmax scale of DeepSeek-V3's 192-wide heads.
  const kernels::LatentAttentionParams p{.tokens = 1, .keys = keys, .heads = kHeads, .kv_lora = kLora, .rope = kRope,
                                         .q_offset = keys - 1, .scale = 0.072f, .rescale = rescale};
  const int64_t splits = kernels::cpu::KeySplits(p, DefaultThreadPool().num_threads());
  const double seconds = FastestIteration(state, [&] {
    kernels::cpu::LatentAttention(isa, splits, q_lat.data(), q_pe.data(), c_kv.Next(), k_pe.Next(), p, out.data());
    benchmark::DoNotOptimize(out.data());
  });
  // The cache is read once; every head takes a dot product with each row and adds the row to its
  // output. The arithmetic is F32 whatever the cache holds.
  const double bytes = static_cast<double>(sizeof(T)) * keys * (kLora + kRope);
  const double ops = 2.0 * kHeads * keys * (kLora + kRope + kLora);
  ReportRoofline(state, seconds, bytes, ops, Limits().f32_gflops);
}

// A decode step's latent attention: 32 sequences of `keys` keys each, one token each, over a paged
// BF16 cache whose blocks of 16 lie in shuffled order, the sequences shared among the threads one
// whole sequence per task, as MlaForward runs them (each call reads its cache from memory).
void BM_LatentAttentionDecodeBatch(benchmark::State& state) {
  constexpr int64_t kSequences = 32, kBlock = 16;
  const int64_t keys = state.range(0), blocks_per_sequence = (keys + kBlock - 1) / kBlock;
  const int64_t cache_rows = kSequences * blocks_per_sequence * kBlock;
  std::mt19937 rng(9);
  const std::vector<float> q_lat = RandomCache<float>(kSequences * kHeads * kLora, rng);
  const std::vector<float> q_pe = RandomCache<float>(kSequences * kHeads * kRope, rng);
  Rotation<bf16> c_kv(RandomCache<bf16>(cache_rows * kLora, rng)), k_pe(RandomCache<bf16>(cache_rows * kRope, rng));
  std::vector<int32_t> blocks(kSequences * blocks_per_sequence);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<float> out(kSequences * kHeads * kLora);
  const double seconds = FastestIteration(state, [&] {
    const bf16* c = c_kv.Next();
    const bf16* k = k_pe.Next();
    ParallelFor(kSequences, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        const kernels::LatentAttentionParams p{.tokens = 1, .keys = keys, .heads = kHeads, .kv_lora = kLora,
                                               .rope = kRope, .q_offset = keys - 1, .scale = 0.072f,
                                               .block_table = blocks.data() + s * blocks_per_sequence,
                                               .block_size = kBlock};
        kernels::LatentAttention(q_lat.data() + s * kHeads * kLora, q_pe.data() + s * kHeads * kRope, c, k, p,
                                 out.data() + s * kHeads * kLora);
      }
    });
    benchmark::DoNotOptimize(out.data());
  });
  const double bytes = static_cast<double>(sizeof(bf16)) * kSequences * keys * (kLora + kRope);
  const double ops = 2.0 * kSequences * kHeads * keys * (kLora + kRope + kLora);
  ReportRoofline(state, seconds, bytes, ops, Limits().f32_gflops);
}

void BM_PromptAttention(benchmark::State& state, bool bf16_products, kernels::cpu::Isa isa) {
  const int64_t tokens = state.range(0), qk = 192, vdim = 128;
  std::mt19937 rng(7);
  const std::vector<float> q = RandomCache<float>(tokens * kHeads * qk, rng);
  const std::vector<float> k = RandomCache<float>(tokens * kHeads * qk, rng);
  const std::vector<float> v = RandomCache<float>(tokens * kHeads * vdim, rng);
  std::vector<float> out(tokens * kHeads * vdim);
  const kernels::AttentionParams p{.tokens = tokens, .keys = tokens, .heads = kHeads, .qk_dim = qk, .v_dim = vdim,
                                   .q_offset = 0, .scale = 0.072f, .bf16_products = bf16_products};
  const double seconds = FastestIteration(state, [&] {
    kernels::cpu::Attention(isa, q.data(), k.data(), v.data(), p, out.data());
    benchmark::DoNotOptimize(out.data());
  });
  // Causal: query t takes t + 1 keys, each a qk-wide dot product and a v-wide weighted add.
  const double ops = 2.0 * kHeads * (tokens * (tokens + 1) / 2.0) * (qk + vdim);
  const double bytes = sizeof(float) * tokens * kHeads * (2.0 * qk + 2.0 * vdim);
  const double peak = !bf16_products                   ? Limits().f32_gflops
                      : isa == kernels::cpu::Isa::kAmx ? Limits().amx_bf16_gflops
                                                       : Limits().bf16_gflops;
  ReportRoofline(state, seconds, bytes, ops, peak);
}

void Register(const std::string& name, void (*fn)(benchmark::State&, kernels::SoftmaxRescale, kernels::cpu::Isa),
              kernels::SoftmaxRescale rescale, kernels::cpu::Isa isa, std::vector<int64_t> contexts) {
  auto* b = benchmark::RegisterBenchmark(("LatentAttention/" + name).c_str(), fn, rescale, isa);
  b->ArgName("keys")->UseRealTime()->MinTime(0.2);
  for (int64_t keys : contexts) b->Arg(keys);
}

}  // namespace

void RegisterAttentionBenchmarks() {
  using kernels::SoftmaxRescale;
  const kernels::cpu::Isa best = kernels::cpu::BestLatentIsa();
  Register("bf16_cache/amla", BM_LatentAttention<bf16>, SoftmaxRescale::kAmla, best, {1024, 4096, 16384});
  Register("bf16_cache/plain", BM_LatentAttention<bf16>, SoftmaxRescale::kMultiply, best, {1024, 4096, 16384});
  Register("f32_cache/amla", BM_LatentAttention<float>, SoftmaxRescale::kAmla, best, {1024, 4096, 16384});
  Register("f32_cache/plain", BM_LatentAttention<float>, SoftmaxRescale::kMultiply, best, {1024, 4096, 16384});
  using kernels::cpu::Isa;
  for (const auto& [name, bf16, isa] : {std::tuple{"PromptAttention/f32_products/avx2", false, Isa::kAvx2},
                                        std::tuple{"PromptAttention/f32_products", false, Isa::kAvx512},
                                        std::tuple{"PromptAttention/bf16_products", true, Isa::kAvx512},
                                        std::tuple{"PromptAttention/bf16_products/amx", true, Isa::kAmx}}) {
    if (!kernels::cpu::IsaSupported(isa) || (bf16 && !GetCpuFeatures().avx512bf16)) continue;
    benchmark::RegisterBenchmark(name, BM_PromptAttention, bf16, isa)
        ->ArgName("tokens")->UseRealTime()->MinTime(0.2)->Arg(512)->Arg(2048);
  }
  benchmark::RegisterBenchmark("LatentAttention/decode_batch_32", BM_LatentAttentionDecodeBatch)
      ->ArgName("keys")->UseRealTime()->MinTime(0.2)->Arg(160)->Arg(1024);
  // The scalar fallback, for scale.
  Register("bf16_cache/amla/generic", BM_LatentAttention<bf16>, SoftmaxRescale::kAmla, kernels::cpu::Isa::kGeneric,
           {1024});
}

}  // namespace moe::bench
