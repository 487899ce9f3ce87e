#include "kernels/cpu/argmax_candidates.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace moe::kernels::cpu {
namespace {

const Isa kIsas[] = {Isa::kGeneric, Isa::kAvx512};

// The definition, column by column: j is a candidate when its upper end reaches every column's
// lower end's maximum.
std::vector<int32_t> CandidatesByDefinition(const std::vector<float>& first, const std::vector<float>& norms,
                                            float bound) {
  float threshold = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < first.size(); ++j) threshold = std::max(threshold, first[j] - bound * norms[j]);
  std::vector<int32_t> out;
  for (size_t j = 0; j < first.size(); ++j) {
    if (first[j] + bound * norms[j] >= threshold) out.push_back(static_cast<int32_t>(j));
  }
  return out;
}

// Logits with a few leaders spread over the row (so that several blocks of 256 hold candidates and
// most hold none), exact ties among them, and n not a multiple of 16 or 256.
TEST(ArgmaxCandidatesTest, EveryVariantFindsTheColumnsOfTheDefinition) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (const int64_t n : {1, 15, 16, 17, 255, 256, 257, 1000, 129280 + 3}) {
    std::vector<float> first(n), norms(n);
    for (int64_t j = 0; j < n; ++j) {
      first[j] = normal(rng);
      norms[j] = 0.5f + std::abs(normal(rng));
    }
    for (int64_t j = 3; j < n; j += 397) first[j] = 6.0f + 0.01f * static_cast<float>(j % 5);
    if (n > 800) first[800] = first[3];
    for (const float bound : {0.0f, 0.005f, 0.3f}) {
      const std::vector<int32_t> expected = CandidatesByDefinition(first, norms, bound);
      ASSERT_FALSE(expected.empty());
      for (const Isa isa : kIsas) {
        if (!IsaSupported(isa)) continue;
        std::vector<int32_t> found = {-1};  // what was there before goes
        MaxCandidates(isa, first.data(), norms.data(), n, bound, found);
        EXPECT_EQ(found, expected) << "n " << n << ", bound " << bound << ", isa " << static_cast<int>(isa);
      }
    }
  }
}

// A NaN logit is never a candidate and does not move the threshold, in every variant alike.
TEST(ArgmaxCandidatesTest, NaNColumnsAreSkipped) {
  const int64_t n = 40;
  std::vector<float> first(n, 1.0f), norms(n, 1.0f);
  first[5] = std::numeric_limits<float>::quiet_NaN();
  first[20] = 3.0f;
  for (const Isa isa : kIsas) {
    if (!IsaSupported(isa)) continue;
    std::vector<int32_t> found;
    MaxCandidates(isa, first.data(), norms.data(), n, 0.5f, found);
    EXPECT_EQ(found, std::vector<int32_t>{20}) << "isa " << static_cast<int>(isa);
  }
}

TEST(ArgmaxCandidatesTest, DotInt8IsExactAtTheExtremes) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(-128, 127);
  for (const int64_t k : {0, 1, 15, 16, 17, 301, 2048, 7168}) {
    std::vector<int8_t> a(k), b(k);
    for (int64_t p = 0; p < k; ++p) {
      a[p] = static_cast<int8_t>(byte(rng));
      b[p] = static_cast<int8_t>(byte(rng));
    }
    int64_t expected = 0;
    for (int64_t p = 0; p < k; ++p) expected += int64_t{a[p]} * b[p];
    const std::vector<int8_t> lowest(k, -128);
    for (const Isa isa : kIsas) {
      if (!IsaSupported(isa)) continue;
      EXPECT_EQ(DotInt8(isa, a.data(), b.data(), k), expected) << "k " << k;
      EXPECT_EQ(DotInt8(isa, lowest.data(), lowest.data(), k), 16384 * k) << "k " << k;
    }
  }
}

}  // namespace
}  // namespace moe::kernels::cpu
