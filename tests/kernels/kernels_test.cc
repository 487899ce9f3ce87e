// Every CPU kernel against its scalar twin in kernels/ref, on random data and odd sizes.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/kernels.h"
#include "kernels/ref/ref.h"

namespace moe::kernels {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, float tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance * (1.0f + std::fabs(want[i]))) << "at index " << i;
  }
}

class MatmulTest : public testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(MatmulTest, F32MatchesReference) {
  const auto [m, k, n] = GetParam();
  std::vector<float> x = Random(m * k, 1), w = Random(n * k, 2), y(m * n), want(m * n);
  const TensorView wv{w.data(), DType::kF32, {n, k}};
  Matmul(x.data(), m, wv, y.data());
  ref::Matmul(x.data(), m, wv, want.data());
  ExpectNear(y, want, 1e-4f);
}

TEST_P(MatmulTest, Bf16MatchesReference) {
  const auto [m, k, n] = GetParam();
  std::vector<float> x = Random(m * k, 3), w = Random(n * k, 4), y(m * n), want(m * n);
  std::vector<bf16> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = F32ToBf16(w[i]);
  const TensorView wv{wb.data(), DType::kBF16, {n, k}};
  Matmul(x.data(), m, wv, y.data());
  ref::Matmul(x.data(), m, wv, want.data());
  // Both round activations to BF16, so only the accumulation order differs.
  ExpectNear(y, want, 1e-3f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest,
                         testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(1, 64, 32),
                                         std::make_tuple(3, 17, 5), std::make_tuple(7, 129, 33),
                                         std::make_tuple(64, 256, 96), std::make_tuple(13, 1000, 3)));

TEST(RmsNormTest, MatchesReference) {
  for (int64_t dim : {1, 7, 64, 513}) {
    const int64_t rows = 5;
    std::vector<float> x = Random(rows * dim, 5), w = Random(dim, 6), y(rows * dim), want(rows * dim);
    RmsNorm(x.data(), w.data(), rows, dim, 1e-6f, y.data());
    ref::RmsNorm(x.data(), w.data(), rows, dim, 1e-6f, want.data());
    ExpectNear(y, want, 1e-5f);
    RmsNorm(x.data(), w.data(), rows, dim, 1e-6f, x.data());  // in place
    ExpectNear(x, want, 1e-5f);
  }
}

TEST(SiluMulTest, MatchesReference) {
  const int64_t n = 10007;
  std::vector<float> g = Random(n, 7, 4.0f), u = Random(n, 8), y(n), want(n);
  SiluMul(g.data(), u.data(), n, y.data());
  ref::SiluMul(g.data(), u.data(), n, want.data());
  ExpectNear(y, want, 1e-5f);
}

TEST(RopeTest, MatchesReferenceAndPreservesNorm) {
  const int64_t tokens = 9, heads = 3, dim = 8, stride = heads * (dim + 2);
  std::vector<double> inv_freq = {1.0, 0.1, 0.01, 0.001};
  const RopeParams rope{inv_freq.data(), dim, 1.0};
  std::vector<int32_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(100 * t + 3);
  std::vector<float> x = Random(tokens * stride, 9), want = x;
  ApplyRope(x.data() + 2, tokens, heads, stride, dim + 2, positions.data(), rope);
  ref::ApplyRope(want.data() + 2, tokens, heads, stride, dim + 2, positions.data(), rope);
  ExpectNear(x, want, 1e-5f);
}

TEST(AttentionTest, MatchesReference) {
  for (int64_t q_offset : {0, 5}) {
    AttentionParams p{.tokens = 4, .keys = q_offset + 4, .heads = 3, .qk_dim = 11, .v_dim = 7,
                      .q_offset = q_offset, .scale = 0.3f};
    std::vector<float> q = Random(p.tokens * p.heads * p.qk_dim, 10), k = Random(p.keys * p.heads * p.qk_dim, 11);
    std::vector<float> v = Random(p.keys * p.heads * p.v_dim, 12);
    std::vector<float> out(p.tokens * p.heads * p.v_dim), want(out.size());
    Attention(q.data(), k.data(), v.data(), p, out.data());
    ref::Attention(q.data(), k.data(), v.data(), p, want.data());
    ExpectNear(out, want, 1e-5f);
  }
}

TEST(LatentAttentionTest, MatchesReference) {
  for (int64_t q_offset : {0, 9}) {
    LatentAttentionParams p{.tokens = 3, .keys = q_offset + 3, .heads = 4, .kv_lora = 33, .rope = 6,
                            .q_offset = q_offset, .scale = 0.2f};
    std::vector<float> ql = Random(p.tokens * p.heads * p.kv_lora, 13), qp = Random(p.tokens * p.heads * p.rope, 14);
    std::vector<float> c = Random(p.keys * p.kv_lora, 15), kp = Random(p.keys * p.rope, 16);
    std::vector<float> out(p.tokens * p.heads * p.kv_lora), want(out.size());
    LatentAttention(ql.data(), qp.data(), c.data(), kp.data(), p, out.data());
    ref::LatentAttention(ql.data(), qp.data(), c.data(), kp.data(), p, want.data());
    ExpectNear(out, want, 1e-5f);
  }
}

}  // namespace
}  // namespace moe::kernels
