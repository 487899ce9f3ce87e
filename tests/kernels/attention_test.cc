// Attention (expanded form): every ISA variant the machine runs, with F32 and BF16 products,
// against kernels/ref, on odd sizes and on DeepSeek-V3's head sizes across several key tiles; and
// a token's output the same bits whether its prompt comes whole or in chunks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/attention.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref.h"
#include "random_data.h"

namespace moe::kernels {
namespace {

using cpu::Isa;

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (cpu::IsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

struct Problem {
  AttentionParams p;
  std::vector<float> q, k, v;
};

Problem RandomProblem(AttentionParams p, uint32_t seed, float q_scale = 1.0f) {
  return {p, Random(p.tokens * p.heads * p.qk_dim, seed, q_scale), Random(p.keys * p.heads * p.qk_dim, seed + 1),
          Random(p.keys * p.heads * p.v_dim, seed + 2)};
}

std::vector<float> RunAttention(const Problem& pr, Isa isa) {
  std::vector<float> out(pr.p.tokens * pr.p.heads * pr.p.v_dim);
  cpu::Attention(isa, pr.q.data(), pr.k.data(), pr.v.data(), pr.p, out.data());
  return out;
}

// Each variant against ref with the operands rounded as that variant rounds them: F32 products
// within 1e-5 of the largest output, as F32 sums of a few hundred products come out against ref's
// double ones; BF16 products within 2^-8, the rounding of the probabilities (which ref keeps
// exact), twice over.
void ExpectMatchesRef(Problem pr) {
  for (bool bf16_products : {false, true}) {
    pr.p.bf16_products = bf16_products;
    for (Isa isa : SupportedIsas()) {
      AttentionParams ref_params = pr.p;
      ref_params.bf16_products = cpu::UsesBf16Products(isa, pr.p);
      std::vector<float> want(pr.p.tokens * pr.p.heads * pr.p.v_dim);
      ref::Attention(pr.q.data(), pr.k.data(), pr.v.data(), ref_params, want.data());
      float scale = 0;
      for (float w : want) scale = std::max(scale, std::fabs(w));
      const float tolerance = (ref_params.bf16_products ? 1.0f / 256 : 1e-5f) * scale;
      const std::vector<float> got = RunAttention(pr, isa);
      const std::string what = "isa " + std::to_string(static_cast<int>(isa)) + (bf16_products ? " bf16" : " f32");
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
        ASSERT_NEAR(got[i], want[i], tolerance) << what << " at " << i;
      }
    }
  }
}

TEST(AttentionTest, OddSizesMatchReference) {
  for (int64_t q_offset : {0, 5, 70}) {
    for (int64_t tokens : {1, 4, 67}) {
      const AttentionParams p{.tokens = tokens, .keys = q_offset + tokens, .heads = 3, .qk_dim = 11, .v_dim = 7,
                              .q_offset = q_offset, .scale = 0.3f};
      SCOPED_TRACE("q_offset " + std::to_string(q_offset) + ", tokens " + std::to_string(tokens));
      ExpectMatchesRef(RandomProblem(p, static_cast<uint32_t>(10 + tokens + q_offset)));
    }
  }
}

TEST(AttentionTest, DeepSeekHeadSizesMatchReference) {
  // qk 192 = nope 128 + rope 64, v 128; a chunk after a cached prefix, crossing key tiles.
  const AttentionParams p{.tokens = 150, .keys = 300, .heads = 2, .qk_dim = 192, .v_dim = 128, .q_offset = 150,
                          .scale = 1.0f / std::sqrt(192.0f)};
  ExpectMatchesRef(RandomProblem(p, 40));
}

TEST(AttentionTest, PeakedScoresMatchReference) {
  // Large scores: the running max moves by many units between tiles and most weights underflow.
  const AttentionParams p{.tokens = 70, .keys = 200, .heads = 2, .qk_dim = 32, .v_dim = 40, .q_offset = 130,
                          .scale = 1.0f};
  ExpectMatchesRef(RandomProblem(p, 50, 8.0f));
}

// A token's output is the same bits in a chunk of any size at any offset: a prompt split at
// `cuts` gives what the whole prompt gives.
TEST(AttentionTest, ChunkedPromptGivesTheSameBits) {
  const int64_t tokens = 203, heads = 3, qk = 40, vdim = 24;
  Problem whole = RandomProblem({.tokens = tokens, .keys = tokens, .heads = heads, .qk_dim = qk, .v_dim = vdim,
                                       .q_offset = 0, .scale = 0.2f},
                                      60);
  for (const auto& [isa, bf16_products] : {std::pair{Isa::kGeneric, false}, std::pair{Isa::kAvx2, false}, std::pair{Isa::kAvx512, false},
                                           std::pair{Isa::kAvx512, true}, std::pair{Isa::kAmx, true}}) {
    if (!cpu::IsaSupported(isa)) continue;
    whole.p.bf16_products = bf16_products;
    const std::vector<float> want = RunAttention(whole, isa);
    for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{1, 64, 130}, std::vector<int64_t>{63, 100, 202}}) {
      std::vector<int64_t> edges = {0};
      edges.insert(edges.end(), cuts.begin(), cuts.end());
      edges.push_back(tokens);
      for (size_t c = 0; c + 1 < edges.size(); ++c) {
        Problem chunk = whole;
        chunk.p.tokens = edges[c + 1] - edges[c];
        chunk.p.q_offset = edges[c];
        chunk.p.keys = edges[c + 1];
        chunk.q.assign(whole.q.begin() + edges[c] * heads * qk, whole.q.begin() + edges[c + 1] * heads * qk);
        const std::vector<float> got = RunAttention(chunk, isa);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data() + edges[c] * heads * vdim, got.size() * sizeof(float)))
            << "isa " << static_cast<int>(isa) << (bf16_products ? " bf16" : " f32") << ", chunk from " << edges[c];
      }
    }
  }
}

}  // namespace
}  // namespace moe::kernels
