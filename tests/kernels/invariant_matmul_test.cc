// BatchInvariantMatmul: close to kernels/ref like Matmul, and a row's result the same bits whatever
// the other rows are -- how many, where the row sits, which thread split -- in every summation
// order, on the native (AVX-512 or AVX2, AMX) and generic loops alike, which also agree with each other to
// the bit (so the generic loops state each order, and VDPBF16PS and TDPBF16PS are checked against
// their definitions).
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "base/cpu_features.h"
#include "kernels/cpu/invariant_matmul.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref.h"
#include "random_data.h"

namespace moe::kernels {
namespace {

// The variants this CPU runs: each order on the generic loops, and on the native ones where the
// CPU has what that order needs.
struct Variant {
  bool native;
  cpu::SumOrder order;
};

std::vector<Variant> Variants() {
  std::vector<Variant> variants;
  for (cpu::SumOrder order : {cpu::SumOrder::kLanes, cpu::SumOrder::kBf16Pairs, cpu::SumOrder::kAmxTiles}) {
    variants.push_back({false, order});
    if (cpu::HasNativeLoops(order)) variants.push_back({true, order});
  }
  return variants;
}

std::string Name(const Variant& v) {
  const char* order = v.order == cpu::SumOrder::kLanes ? " lanes" : v.order == cpu::SumOrder::kBf16Pairs ? " bf16 pairs" : " amx tiles";
  return std::string(v.native ? "native" : "generic") + order;
}

// A weight [n, k] in `dtype` (F32 or BF16) and the storage behind it.
struct TestWeight {
  TestWeight(int64_t n, int64_t k, DType dtype, uint32_t seed) : f32(Random(n * k, seed)), bf(f32.size()) {
    for (size_t i = 0; i < f32.size(); ++i) bf[i] = F32ToBf16(f32[i]);
    view = dtype == DType::kF32 ? TensorView{f32.data(), DType::kF32, {n, k}} : TensorView{bf.data(), DType::kBF16, {n, k}};
  }
  std::vector<float> f32;
  std::vector<bf16> bf;
  TensorView view;
};

bool SameBits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

class InvariantMatmulTest : public testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, DType>> {};

TEST_P(InvariantMatmulTest, MatchesReference) {
  const auto [m, k, n, dtype] = GetParam();
  const TestWeight w(n, k, dtype, 2);
  const std::vector<float> x = Random(m * k, 1);
  std::vector<float> want(m * n);
  ref::Matmul(x.data(), m, w.view, want.data());
  for (const Variant& v : Variants()) {
    std::vector<float> y(m * n);
    cpu::BatchInvariantMatmul(v.native, v.order, x.data(), m, w.view, y.data());
    // As Matmul's tests: BF16 rounds the activations in both, so only the order of the sums differs.
    const float tolerance = dtype == DType::kF32 ? 1e-4f : 1e-3f;
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_NEAR(y[i], want[i], tolerance * (1.0f + std::fabs(want[i]))) << Name(v) << " at " << i;
    }
  }
}

TEST_P(InvariantMatmulTest, RowsDoNotDependOnTheBatch) {
  const auto [m, k, n, dtype] = GetParam();
  const TestWeight w(n, k, dtype, 4);
  const int64_t rows = m + 9;
  const std::vector<float> x = Random(rows * k, 3);
  for (const Variant& v : Variants()) {
    // The generic loops of the same order, all rows at once: the bits every variant must give.
    std::vector<float> generic(rows * n);
    cpu::BatchInvariantMatmul(false, v.order, x.data(), rows, w.view, generic.data());
    // Each row alone, then windows [first, first + count) of the rows as one batch.
    std::vector<float> alone(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      cpu::BatchInvariantMatmul(v.native, v.order, x.data() + r * k, 1, w.view, alone.data() + r * n);
    }
    EXPECT_TRUE(SameBits(alone.data(), generic.data(), rows * n)) << Name(v) << " vs generic";
    for (int64_t first : {int64_t{0}, int64_t{1}, int64_t{5}}) {
      for (int64_t count : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{8}, m, rows - first}) {
        if (count < 1 || first + count > rows) continue;
        std::vector<float> y(count * n);
        cpu::BatchInvariantMatmul(v.native, v.order, x.data() + first * k, count, w.view, y.data());
        EXPECT_TRUE(SameBits(y.data(), alone.data() + first * n, count * n))
            << Name(v) << ": rows " << first << ".." << first + count;
      }
    }
  }
  // The public entry point is the best variant of the CPU.
  std::vector<float> y(rows * n), want(rows * n);
  BatchInvariantMatmul(x.data(), rows, w.view, y.data());
  cpu::BatchInvariantMatmul(false, cpu::BestSumOrder(), x.data(), rows, w.view, want.data());
  EXPECT_TRUE(SameBits(y.data(), want.data(), rows * n));
}

INSTANTIATE_TEST_SUITE_P(Shapes, InvariantMatmulTest,
                         testing::Combine(testing::Values(int64_t{1}, int64_t{7}, int64_t{33}),
                                          testing::Values(int64_t{1}, int64_t{16}, int64_t{129}, int64_t{256}),
                                          testing::Values(int64_t{1}, int64_t{5}, int64_t{37}, int64_t{64}),
                                          testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           std::ostringstream name;
                           name << "m" << std::get<0>(info.param) << "_k" << std::get<1>(info.param) << "_n"
                                << std::get<2>(info.param) << (std::get<3>(info.param) == DType::kF32 ? "_f32" : "_bf16");
                           return name.str();
                         });

TEST(InvariantMatmulTest, Int8GoesToTheExactMatmul) {
  const int64_t m = 5, k = 70, n = 9;
  const std::vector<float> x = Random(m * k, 5), w = Random(n * k, 6);
  std::vector<int8_t> wq(n * k);
  std::vector<float> scales(n), y(m * n), want(m * n);
  QuantizeRows(w.data(), n, k, wq.data(), scales.data());
  const Weight wv(TensorView{wq.data(), DType::kI8, {n, k}}, scales.data());
  BatchInvariantMatmul(x.data(), m, wv, y.data());
  Matmul(x.data(), m, wv, want.data());
  EXPECT_TRUE(SameBits(y.data(), want.data(), m * n));
}

}  // namespace
}  // namespace moe::kernels
