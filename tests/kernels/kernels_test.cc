// Every CPU kernel against its scalar twin in kernels/ref, on random data and odd sizes.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/kernels.h"
#include "kernels/ref/ref.h"
#include "random_data.h"

namespace moe::kernels {
namespace {

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

TEST_P(MatmulTest, Int8MatchesReferenceExactly) {
  const auto [m, k, n] = GetParam();
  std::vector<float> x = Random(m * k, 5), y(m * n), want(m * n);
  const RandomInt8Weight w(n, k, 6);
  const Weight wv(w.view(), w.scales.data());
  Matmul(x.data(), m, wv, y.data());
  ref::Matmul(x.data(), m, wv, want.data());
  // INT32 accumulation is exact and the scaling is the same expression.
  ExpectNear(y, want, 1e-6f);
}

TEST_P(MatmulTest, PackedInt8MatchesReferenceExactly) {
  const auto [m, k, n] = GetParam();
  const RandomInt8Weight w(n, k, 10);
  const Tensor packed = PackMatmulWeight(w.view()), gemv_packed = PackGemvWeight(w.view());
  const Weight wv(w.view(), w.scales.data(), packed.data<int8_t>(),
                  gemv_packed.empty() ? nullptr : gemv_packed.data<int8_t>());
  // Batches of other sizes too: each is padded to its row bucket differently, and a few rows run
  // the kernel of the gemv layout.
  for (int64_t rows : {m, m + 16, 3 * m + 120}) {
    std::vector<float> x = Random(rows * k, 9), y(rows * n), want(rows * n);
    Matmul(x.data(), rows, wv, y.data());
    ref::Matmul(x.data(), rows, Weight(w.view(), w.scales.data()), want.data());
    ExpectNear(y, want, 1e-6f);
  }
}

TEST_P(MatmulTest, Int8IsCloseToFloat) {
  const auto [m, k, n] = GetParam();
  std::vector<float> x = Random(m * k, 7), w = Random(n * k, 8), y(m * n), exact(m * n);
  std::vector<int8_t> wq(n * k);
  std::vector<float> scales(n);
  QuantizeRows(w.data(), n, k, wq.data(), scales.data());
  Matmul(x.data(), m, Weight(TensorView{wq.data(), DType::kI8, {n, k}}, scales.data()), y.data());
  ref::Matmul(x.data(), m, TensorView{w.data(), DType::kF32, {n, k}}, exact.data());
  // Each operand is off by at most half a step of 1/127 of its row's max; the error of a dot product
  // of k terms grows like sqrt(k).
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], exact[i], 0.05f * std::sqrt(static_cast<float>(k)) + 0.02f);
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

TEST(QuantizeRowsTest, MatchesReferenceAndHandlesZeroRows) {
  const int64_t rows = 6, cols = 37;
  std::vector<float> x = Random(rows * cols, 9, 3.0f);
  std::fill(x.begin() + 2 * cols, x.begin() + 3 * cols, 0.0f);
  std::vector<int8_t> q(rows * cols), want_q(rows * cols);
  std::vector<float> s(rows), want_s(rows);
  QuantizeRows(x.data(), rows, cols, q.data(), s.data());
  ref::QuantizeRows(x.data(), rows, cols, want_q.data(), want_s.data());
  EXPECT_EQ(q, want_q);
  EXPECT_EQ(s, want_s);
  EXPECT_EQ(s[2], 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    int max_q = 0;
    for (int64_t c = 0; c < cols; ++c) max_q = std::max(max_q, std::abs(static_cast<int>(q[r * cols + c])));
    EXPECT_EQ(max_q, r == 2 ? 0 : 127) << "row " << r;
  }
}

TEST(QuantizeRowsTest, RoundsHalvesToEvenInVectorAndTail) {
  // max |x| = 127 makes the scale 1, so each x * (127 / max) is x itself: ties stay ties.
  std::vector<float> x = {127.0f};
  for (int i = 0; i < 40; ++i) x.push_back((i % 2 ? -1.0f : 1.0f) * (static_cast<float>(i) + 0.5f));
  const auto cols = static_cast<int64_t>(x.size());
  std::vector<int8_t> q(cols), want_q(cols);
  float s = 0, want_s = 0;
  QuantizeRows(x.data(), 1, cols, q.data(), &s);
  ref::QuantizeRows(x.data(), 1, cols, want_q.data(), &want_s);
  EXPECT_EQ(q, want_q);
  EXPECT_EQ(s, want_s);
  EXPECT_EQ(q[1], 0);   //  0.5 -> 0
  EXPECT_EQ(q[2], -2);  // -1.5 -> -2
  EXPECT_EQ(q[4], -4);  // -3.5 -> -4
  EXPECT_EQ(q[36], -36);  // -35.5 -> -36, in the tail
}

TEST(SiluMulTest, MatchesReference) {
  const int64_t n = 10007;
  std::vector<float> g = Random(n, 7, 4.0f), u = Random(n, 8), y(n), want(n);
  SiluMul(g.data(), u.data(), n, y.data());
  ref::SiluMul(g.data(), u.data(), n, want.data());
  ExpectNear(y, want, 1e-5f);
}

TEST(SiluMulTest, ValuesDoNotDependOnTheBatch) {
  // A token's values are the same bits whatever else the call holds (the engine's batch
  // invariance): every length from 1 to 40 against one long call.
  const int64_t n = 10007;
  std::vector<float> g = Random(n, 9, 4.0f), u = Random(n, 10), all(n);
  SiluMul(g.data(), u.data(), n, all.data());
  for (int64_t len = 1; len <= 40; ++len) {
    std::vector<float> part(len);
    SiluMul(g.data() + 5, u.data() + 5, len, part.data());
    EXPECT_EQ(part, std::vector<float>(all.begin() + 5, all.begin() + 5 + len)) << "length " << len;
  }
}

TEST(SiluMulTest, ExtremeGatesStayFinite) {
  // e^-g overflows for very negative gates: silu goes to -0, not NaN; large gates pass through.
  std::vector<float> g = {-200.0f, -100.0f, -88.0f, -20.0f, 0.0f, 20.0f, 88.0f, 100.0f, 200.0f};
  g.resize(37, -150.0f);  // a whole vector and a tail
  const std::vector<float> u(g.size(), 2.0f);
  std::vector<float> y(g.size()), want(g.size());
  SiluMul(g.data(), u.data(), static_cast<int64_t>(g.size()), y.data());
  ref::SiluMul(g.data(), u.data(), static_cast<int64_t>(g.size()), want.data());
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

}  // namespace
}  // namespace moe::kernels
