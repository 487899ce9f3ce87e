#include "tensor/tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

namespace moe {
namespace {

bool AllZero(const Tensor& t) {
  const auto* bytes = static_cast<const uint8_t*>(t.raw());
  return std::all_of(bytes, bytes + t.nbytes(), [](uint8_t b) { return b == 0; });
}

uintptr_t Address(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw()); }

TEST(Tensor, BuffersAreZeroedAndCacheLineAligned) {
  // Empty, small, and large ones, including sizes that are not a whole number of pages.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{65}, int64_t{1000}, int64_t{1} << 20,
                    (int64_t{5} << 20) + 123}) {
    const Tensor t(DType::kBF16, {n});
    EXPECT_EQ(t.nbytes(), static_cast<size_t>(2 * n));
    EXPECT_EQ(Address(t) % 64, 0u) << n;
    EXPECT_TRUE(AllZero(t)) << n;
  }
}

TEST(Tensor, ForOverwriteHasTheShapeAndAlignment) {
  for (int64_t n : {int64_t{0}, int64_t{3}, (int64_t{5} << 20) + 123}) {
    Tensor t = Tensor::ForOverwrite(DType::kF32, {2, n});
    EXPECT_EQ(t.shape(), (Shape{2, n}));
    EXPECT_EQ(t.nbytes(), static_cast<size_t>(8 * n));
    EXPECT_EQ(Address(t) % 64, 0u) << n;
    std::fill_n(t.data<float>(), 2 * n, 1.5f);
    EXPECT_TRUE(std::all_of(t.data<float>(), t.data<float>() + 2 * n, [](float v) { return v == 1.5f; }));
  }
}

TEST(Tensor, ReshapeKeepsTheBytes) {
  Tensor t = Tensor::F32({2, 3});
  t.data<float>()[5] = 7;
  t.Reshape({3, 2});
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.data<float>()[5], 7);
}

}  // namespace
}  // namespace moe
