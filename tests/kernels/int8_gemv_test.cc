// Int8Gemv's INT32 products (and Int8GemvScaled's F32 ones), on every instruction set the CPU runs
// and both ways of streaming the weight, against a scalar loop, to the bit, on odd shapes and extreme values; and Matmul of I8 weights, which runs Int8Gemv for a few rows and oneDNN
// for more, giving a row the same bits whatever the batch around it and whichever layouts the weight
// comes in.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/int8_gemv.h"
#include "kernels/kernels.h"
#include "random_data.h"

namespace moe::kernels {
namespace {

// Rows past every count where Matmul leaves Int8Gemv for another kernel (kInt8GemvMaxRowsBesideAmx,
// kInt8GemvMaxRows, kInt8GemvMaxRowsSideBySide), and more.
constexpr int64_t kPastGemvRows = 67;

std::vector<int8_t> RandomInt8(int64_t count, uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<int8_t> v(count);
  for (int8_t& e : v) e = static_cast<int8_t>(dist(rng));
  return v;
}

std::vector<int32_t> ScalarProducts(const std::vector<int8_t>& x, int64_t m, const std::vector<int8_t>& w, int64_t n,
                                    int64_t k) {
  std::vector<int32_t> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      int32_t sum = 0;
      for (int64_t p = 0; p < k; ++p) sum += int32_t{x[i * k + p]} * int32_t{w[j * k + p]};
      y[i * n + j] = sum;
    }
  }
  return y;
}

const char* GemvIsaName(cpu::GemvIsa isa) {
  switch (isa) {
    case cpu::GemvIsa::kAvx2: return "avx2";
    case cpu::GemvIsa::kAvxVnni: return "avx-vnni";
    case cpu::GemvIsa::kAvx512Vnni: return "avx512-vnni";
  }
  return "?";
}

const char* GemvStreamsName(cpu::GemvStreams streams) {
  return streams == cpu::GemvStreams::kSideBySide ? "blocks side by side" : "block halves";
}

std::vector<cpu::GemvIsa> SupportedGemvIsas() {
  std::vector<cpu::GemvIsa> isas;
  for (cpu::GemvIsa isa : {cpu::GemvIsa::kAvx2, cpu::GemvIsa::kAvxVnni, cpu::GemvIsa::kAvx512Vnni}) {
    if (cpu::GemvIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

// Int8Gemv and Int8GemvScaled on every instruction set the CPU runs, and both streams, against the
// scalar products.
void ExpectProductsExact(const std::vector<int8_t>& x, int64_t m, const std::vector<int8_t>& w, int64_t n, int64_t k) {
  std::vector<uint8_t> packed(cpu::Int8GemvPackedBytes(n, k));
  cpu::PackInt8Gemv(w.data(), n, k, packed.data());
  const std::vector<int32_t> want = ScalarProducts(x, m, w, n, k);
  std::vector<float> x_scales(m), w_scales(n);
  for (int64_t i = 0; i < m; ++i) x_scales[i] = 0.01f + 0.003f * static_cast<float>(i);
  for (int64_t j = 0; j < n; ++j) w_scales[j] = 0.02f - 0.0001f * static_cast<float>(j);
  for (cpu::GemvIsa isa : SupportedGemvIsas()) {
    for (cpu::GemvStreams streams : {cpu::GemvStreams::kBlockHalves, cpu::GemvStreams::kSideBySide}) {
      std::vector<int32_t> y(m * n);
      cpu::Int8Gemv(isa, streams, x.data(), m, packed.data(), n, k, y.data());
      for (int64_t i = 0; i < m * n; ++i) {
        ASSERT_EQ(y[i], want[i]) << GemvIsaName(isa) << ", " << GemvStreamsName(streams) << ": m " << m << " n " << n
                                 << " k " << k << " at row " << i / n << " column " << i % n;
      }
      // Scaled: each product times its row's and its column's scale, in that order, to the bit.
      std::vector<float> scaled(m * n);
      cpu::Int8GemvScaled(isa, streams, x.data(), x_scales.data(), m, packed.data(), n, k, w_scales.data(),
                          scaled.data());
      for (int64_t i = 0; i < m * n; ++i) {
        const float expected = static_cast<float>(want[i]) * x_scales[i / n] * w_scales[i % n];
        ASSERT_EQ(std::memcmp(&scaled[i], &expected, sizeof(float)), 0)
            << GemvIsaName(isa) << ", " << GemvStreamsName(streams) << ": m " << m << " n " << n << " k " << k
            << " at row " << i / n << " column " << i % n;
      }
    }
  }
}

class Int8GemvTest : public testing::TestWithParam<std::tuple<int64_t, int64_t>> {
 protected:
  void SetUp() override {
    if (!cpu::Int8GemvSupported()) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512 VNNI";
  }
};

// Every pass size (1-6 rows, passes split evenly), partial column blocks and vectors, k past a
// whole group, odd numbers of groups (one left over after the two halves), several runs a half;
// threads with one block, with several sets of blocks side by side and with some left over, and
// (past the side passes' rows) one block at a time in several passes.
TEST_P(Int8GemvTest, MatchesScalarProductsExactly) {
  const auto [m, k] = GetParam();
  for (int64_t n : {1, 5, 16, 17, 33, 64, 65, 130, 327, 576, 1391}) {
    const std::vector<int8_t> x = RandomInt8(m * k, 1, -127, 127), w = RandomInt8(n * k, 2, -128, 127);
    ExpectProductsExact(x, m, w, n, k);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8GemvTest,
                         testing::Combine(testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 17),
                                          testing::Values(1, 63, 64, 65, 130, 513, 2048)));

// The largest products, each sign; all-zero rows of x and w; and a k long enough for the biased
// sums (w + 128) * x to come near INT32's limit.
TEST(Int8GemvExtremesTest, MatchesScalarProductsExactly) {
  if (!cpu::Int8GemvSupported()) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512 VNNI";
  for (int64_t k : {1, 65, 2048, 65536}) {
    const int64_t m = 5, n = 6;
    std::vector<int8_t> x(m * k), w(n * k);
    for (int64_t p = 0; p < k; ++p) {
      x[0 * k + p] = 127;
      x[1 * k + p] = -127;
      x[2 * k + p] = 0;
      x[3 * k + p] = p % 2 ? 127 : -127;
      x[4 * k + p] = static_cast<int8_t>(p % 255 - 127);
      w[0 * k + p] = 127;
      w[1 * k + p] = -128;
      w[2 * k + p] = -127;
      w[3 * k + p] = 0;
      w[4 * k + p] = p % 2 ? -128 : 127;
      w[5 * k + p] = static_cast<int8_t>(p % 256 - 128);
    }
    ExpectProductsExact(x, m, w, n, k);
  }
}

// No rows: nothing to compute, and nothing written.
TEST(Int8GemvNoRowsTest, WritesNothing) {
  if (!cpu::Int8GemvSupported()) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512 VNNI";
  const int64_t n = 70, k = 40;
  const std::vector<int8_t> w = RandomInt8(n * k, 4, -128, 127);
  std::vector<uint8_t> packed(cpu::Int8GemvPackedBytes(n, k));
  cpu::PackInt8Gemv(w.data(), n, k, packed.data());
  int32_t y = 7;
  cpu::Int8Gemv(nullptr, 0, packed.data(), n, k, &y);
  EXPECT_EQ(y, 7);
}

// Int8GemmAmx (and Int8GemmAmxScaled) on Int8Gemv's packed weight: to the bit, at row counts
// around its tasks of 16 and 32 rows and chunks of 256, over several blocks of k and of columns,
// with the extreme values in the mix.
TEST(Int8GemmAmxTest, MatchesScalarProductsExactly) {
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{64, 64}, {192, 128}, {128, 320}}) {
    if (!cpu::Int8GemmAmxSupported(k, n)) GTEST_SKIP() << "this CPU lacks AMX-INT8";
    std::vector<int8_t> w = RandomInt8(n * k, 3, -128, 127);
    std::fill_n(w.begin(), k, int8_t{-128});
    Tensor weight(DType::kI8, {n, k});
    std::memcpy(weight.raw(), w.data(), w.size());
    const Tensor packed = PackGemvWeight(weight.view());
    const auto* unsigned_packed = reinterpret_cast<const uint8_t*>(packed.data<int8_t>());
    for (int64_t m : {1, 5, 16, 17, 24, 32, 33, 255, 256, 300}) {
      std::vector<int8_t> x = RandomInt8(m * k, 4, -128, 127);
      std::fill_n(x.begin(), k, int8_t{-128});
      std::vector<int32_t> y(m * n, -1);
      cpu::Int8GemmAmx(x.data(), m, k, n, unsigned_packed, y.data());
      const std::vector<int32_t> want = ScalarProducts(x, m, w, n, k);
      for (int64_t i = 0; i < m * n; ++i) {
        ASSERT_EQ(y[i], want[i]) << "m " << m << " n " << n << " k " << k << " at row " << i / n << " column "
                                 << i % n;
      }
      // Scaled: each product times its row's and its column's scale, in that order, to the bit.
      std::vector<float> x_scales(m), w_scales(n), scaled(m * n);
      for (int64_t i = 0; i < m; ++i) x_scales[i] = 0.01f + 0.003f * static_cast<float>(i);
      for (int64_t j = 0; j < n; ++j) w_scales[j] = 0.02f - 0.0001f * static_cast<float>(j);
      cpu::Int8GemmAmxScaled(x.data(), x_scales.data(), m, k, n, unsigned_packed, w_scales.data(),
                             scaled.data());
      for (int64_t i = 0; i < m * n; ++i) {
        const float expected = static_cast<float>(want[i]) * x_scales[i / n] * w_scales[i % n];
        ASSERT_EQ(std::memcmp(&scaled[i], &expected, sizeof(float)), 0)
            << "m " << m << " n " << n << " k " << k << " at row " << i / n << " column " << i % n;
      }
    }
  }
}

// Matmul gives a row the same bits alone and at every place in a batch of every size up to past
// every count where oneDNN or Int8GemmAmx takes over, with the weight plain, packed for
// oneDNN, for both, or, where that layout serves every batch, held only as Int8Gemv lays it out.
TEST(Int8MatmulTest, RowsDoNotDependOnTheBatch) {
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{37, 130}, {64, 2048}, {130, 66}}) {
    const RandomInt8Weight w(n, k, 11);
    const Tensor packed = PackMatmulWeight(w.view()), gemv_packed = PackGemvWeight(w.view());
    const Weight plain(w.view(), w.scales.data()), packed_too(w.view(), w.scales.data(), packed.data<int8_t>());
    const Weight both(w.view(), w.scales.data(), packed.data<int8_t>(),
                      gemv_packed.empty() ? nullptr : gemv_packed.data<int8_t>());
    std::vector<Weight> weights = {plain, packed_too, both};
    if (!gemv_packed.empty() && !NeedsMatmulPacking(n, k)) {
      weights.emplace_back(TensorView{nullptr, DType::kI8, {n, k}}, w.scales.data(), nullptr,
                           gemv_packed.data<int8_t>());
    }
    const int64_t max_rows = kPastGemvRows;
    const std::vector<float> x = Random(max_rows * k, 12);
    std::vector<float> alone(max_rows * n);
    for (int64_t r = 0; r < max_rows; ++r) Matmul(x.data() + r * k, 1, plain, alone.data() + r * n);
    for (const Weight& weight : weights) {
      for (int64_t m = 1; m <= max_rows; ++m) {
        std::vector<float> y(m * n);
        Matmul(x.data(), m, weight, y.data());
        for (int64_t r = 0; r < m; ++r) {
          ASSERT_EQ(std::memcmp(y.data() + r * n, alone.data() + r * n, n * sizeof(float)), 0)
              << "n " << n << " k " << k << " plain " << (weight.data.data != nullptr) << " packed "
              << (weight.packed != nullptr) << " gemv packed " << (weight.gemv_packed != nullptr) << ": row " << r
              << " of " << m;
        }
      }
    }
  }
}

// MatmulQuantizedBlocks, over units of blocks that cover the weight, gives every column the bits
// MatmulQuantized gives it, and leaves the columns outside its blocks as they were.
TEST(Int8MatmulTest, BlocksGiveTheColumnsOfTheWholeProduct) {
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{37, 130}, {200, 2048}, {130, 66}}) {
    const RandomInt8Weight w(n, k, 21);
    const Tensor gemv_packed = PackGemvWeight(w.view());
    if (gemv_packed.empty()) {
      // No Int8Gemv on this CPU (no AVX2): no weight runs by blocks; MatmulQuantized serves it whole.
      EXPECT_FALSE(MatmulRunsByBlocks(1, Weight(w.view(), w.scales.data())));
      continue;
    }
    const Weight weight(w.view(), w.scales.data(), nullptr, gemv_packed.data<int8_t>());
    const int64_t blocks = (n + kMatmulColumnBlock - 1) / kMatmulColumnBlock;
    for (int64_t m = 1; MatmulRunsByBlocks(m, weight) && m <= kPastGemvRows; m += 3) {
      const std::vector<float> x = Random(m * k, 22);
      std::vector<int8_t> q(m * k);
      std::vector<float> q_scales(m);
      QuantizeRows(x.data(), m, k, q.data(), q_scales.data());
      std::vector<float> whole(m * n);
      MatmulQuantized(q.data(), q_scales.data(), m, weight, whole.data());
      for (const int64_t unit : {1, 3, 4}) {
        std::vector<float> y(m * n, std::nanf(""));
        for (int64_t b = 0; b < blocks; b += unit) {
          const int64_t end = std::min(b + unit, blocks);
          MatmulQuantizedBlocks(q.data(), q_scales.data(), m, weight, b, end, y.data());
          for (int64_t i = 0; i < m; ++i) {
            const int64_t done = std::min(end * kMatmulColumnBlock, n);
            ASSERT_EQ(std::memcmp(&y[i * n], &whole[i * n], done * sizeof(float)), 0)
                << "n " << n << " k " << k << " m " << m << " unit " << unit << ": row " << i << " to block " << end;
            ASSERT_TRUE(std::all_of(y.begin() + i * n + done, y.begin() + (i + 1) * n,
                                    [](float v) { return std::isnan(v); }))
                << "n " << n << " k " << k << " m " << m << ": blocks [" << b << ", " << end << ") wrote past them";
          }
        }
      }
    }
  }
}

// MatmulTwoPart: each row the same bits alone and in every batch (its parts run through Int8Gemv
// or oneDNN by the batch's size), and within 2^-13 of the exact products with the INT8 weight --
// where one INT8 part of the activations (Matmul) is off by ~2^-7.
TEST(Int8MatmulTest, TwoPartRowsAreExactToFourteenBitsAndBatchInvariant) {
  const int64_t n = 53, k = 300, max_rows = kPastGemvRows;
  const RandomInt8Weight w(n, k, 21);
  const Tensor packed = PackMatmulWeight(w.view()), gemv_packed = PackGemvWeight(w.view());
  const Weight weight(w.view(), w.scales.data(), packed.data<int8_t>(),
                      gemv_packed.empty() ? nullptr : gemv_packed.data<int8_t>());
  const std::vector<float> x = Random(max_rows * k, 22);
  std::vector<float> alone(max_rows * n), one_part(max_rows * n);
  for (int64_t r = 0; r < max_rows; ++r) MatmulTwoPart(x.data() + r * k, 1, weight, alone.data() + r * n);
  Matmul(x.data(), max_rows, weight, one_part.data());
  double worst_two = 0, worst_one = 0;
  for (int64_t r = 0; r < max_rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      // The exact product with the dequantized weight, against the row's scale sum |x| |w|.
      double exact = 0, magnitude = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double wv = static_cast<double>(w.q[j * k + i]) * w.scales[j];
        exact += x[r * k + i] * wv;
        magnitude += std::fabs(x[r * k + i] * wv);
      }
      worst_two = std::max(worst_two, std::fabs(alone[r * n + j] - exact) / magnitude);
      worst_one = std::max(worst_one, std::fabs(one_part[r * n + j] - exact) / magnitude);
    }
  }
  EXPECT_LT(worst_two, std::ldexp(1.0, -13));
  EXPECT_GT(worst_one, 16 * worst_two);
  for (int64_t m = 1; m <= max_rows; ++m) {
    std::vector<float> y(m * n);
    MatmulTwoPart(x.data(), m, weight, y.data());
    for (int64_t r = 0; r < m; ++r) {
      ASSERT_EQ(std::memcmp(y.data() + r * n, alone.data() + r * n, n * sizeof(float)), 0) << "row " << r << " of " << m;
    }
  }
}

TEST(Int8MatmulTest, RowNormsBoundTheDequantizedRows) {
  const RandomInt8Weight w(37, 301, 41);
  const Tensor norms = I8RowNorms(w.view(), w.scales.data());
  for (int64_t j = 0; j < w.n(); ++j) {
    double squares = 0;
    for (int64_t p = 0; p < w.k(); ++p) squares += std::pow(static_cast<double>(w.q[j * w.k() + p]) * w.scales[j], 2);
    EXPECT_GE(norms.data<float>()[j], std::sqrt(squares)) << "row " << j;
    EXPECT_LE(norms.data<float>()[j], std::sqrt(squares) * (1 + 1e-5)) << "row " << j;
  }
}

// MatmulTwoPart's argmax-only rows: the first maximal column and its value are the full rows' bits,
// every other column is below it, unflagged rows are untouched, and a row's values do not depend on
// the batch. The weight has exact and near ties at the top: rows 7 and 500 equal (the maximum
// must stay at 7), row 501 one unit less in one place.
TEST(Int8MatmulTest, ArgmaxRowsKeepTheirMaximumToTheBit) {
  const int64_t n = 1000, k = 301, m = kPastGemvRows + 1;
  RandomInt8Weight w(n, k, 51);
  w.q[7 * k + 3] = 100;
  for (const int64_t j : {500, 501}) {
    std::copy_n(&w.q[7 * k], k, &w.q[j * k]);
    w.scales[j] = w.scales[7];
  }
  w.q[501 * k + 3] = 99;
  const Tensor packed = PackMatmulWeight(w.view()), gemv_packed = PackGemvWeight(w.view());
  const Tensor norms = I8RowNorms(w.view(), w.scales.data());
  const Weight weight(w.view(), w.scales.data(), packed.data<int8_t>(),
                      gemv_packed.empty() ? nullptr : gemv_packed.data<int8_t>());
  // Rows close to weight row 7, so that rows 7, 500 and 501 lead; every third row random.
  std::vector<float> x = Random(m * k, 52);
  for (int64_t r = 0; r < m; ++r) {
    if (r % 3 == 2) continue;
    for (int64_t p = 0; p < k; ++p) x[r * k + p] = w.q[7 * k + p] / 127.0f + 0.05f * x[r * k + p];
  }
  std::vector<bool> flags(m);
  for (int64_t r = 0; r < m; ++r) flags[r] = r % 4 != 3;
  std::vector<float> full(m * n), argmax(m * n);
  std::vector<int32_t> first_max(m);
  MatmulTwoPart(x.data(), m, weight, full.data());
  MatmulTwoPart(x.data(), m, weight, argmax.data(), flags, norms.data<float>(), first_max.data());
  int64_t shortened = 0;
  for (int64_t r = 0; r < m; ++r) {
    const float* f = full.data() + r * n;
    const float* a = argmax.data() + r * n;
    if (!flags[r]) {
      ASSERT_EQ(std::memcmp(a, f, n * sizeof(float)), 0) << "unflagged row " << r;
      EXPECT_EQ(first_max[r], -1) << "unflagged row " << r;
      continue;
    }
    const int64_t best = std::max_element(f, f + n) - f;
    ASSERT_EQ(std::max_element(a, a + n) - a, best) << "row " << r;
    EXPECT_EQ(first_max[r], best) << "row " << r;
    ASSERT_EQ(std::memcmp(&a[best], &f[best], sizeof(float)), 0) << "row " << r;
    if (r % 3 != 2) {
      EXPECT_EQ(best, 7) << "row " << r << ": the tie goes to the first column";
    }
    for (int64_t j = 0; j < n; ++j) EXPECT_LE(a[j], f[best]) << "row " << r << " column " << j;
    shortened += std::memcmp(a, f, n * sizeof(float)) != 0;
  }
  EXPECT_GT(shortened, 0) << "no flagged row skipped any second part";
  // Held only packed (where a CPU's kernels read no plain rows), the weight has no rows to read a
  // few columns from: flags change nothing.
  if (!NeedsPlainI8(n, k)) {
    const Weight packed_only(TensorView{nullptr, DType::kI8, {n, k}}, w.scales.data(), packed.data<int8_t>(),
                             gemv_packed.empty() ? nullptr : gemv_packed.data<int8_t>());
    std::fill(first_max.begin(), first_max.end(), -2);
    MatmulTwoPart(x.data(), m, packed_only, argmax.data(), flags, norms.data<float>(), first_max.data());
    EXPECT_EQ(std::memcmp(argmax.data(), full.data(), m * n * sizeof(float)), 0);
    for (int64_t r = 0; r < m; ++r) {
      const float* f = full.data() + r * n;
      EXPECT_EQ(first_max[r], flags[r] ? std::max_element(f, f + n) - f : -1) << "row " << r << ", packed only";
    }
  }
  MatmulTwoPart(x.data(), m, weight, argmax.data(), flags, norms.data<float>());
  for (int64_t r = 0; r < m; ++r) {
    std::vector<float> alone(n);
    MatmulTwoPart(x.data() + r * k, 1, weight, alone.data(), {flags[r]}, norms.data<float>());
    ASSERT_EQ(std::memcmp(alone.data(), argmax.data() + r * n, n * sizeof(float)), 0) << "row " << r << " alone";
  }
}

}  // namespace
}  // namespace moe::kernels
