#include "base/cpu_features.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace moe {
namespace {

CpuFeatures Everything() {
  CpuFeatures f;
  f.avx2 = f.fma = f.avxvnni = true;
  f.avx512f = f.avx512bw = f.avx512vnni = f.avx512bf16 = true;
  f.amx_bf16 = f.amx_int8 = true;
  return f;
}

TEST(CpuFeaturesTest, ParsesTheTiersAndNothingElse) {
  EXPECT_EQ(ParseIsaTier("generic"), IsaTier::kGeneric);
  EXPECT_EQ(ParseIsaTier("avx2"), IsaTier::kAvx2);
  EXPECT_EQ(ParseIsaTier("avx512"), IsaTier::kAvx512);
  EXPECT_EQ(ParseIsaTier("amx"), IsaTier::kAmx);
  EXPECT_EQ(ParseIsaTier("AVX2"), std::nullopt);
  EXPECT_EQ(ParseIsaTier("sse4"), std::nullopt);
  EXPECT_EQ(ParseIsaTier(""), std::nullopt);
}

TEST(CpuFeaturesTest, CapClearsEveryFeatureAboveTheTier) {
  EXPECT_EQ(CapFeatures(Everything(), IsaTier::kAmx).ToString(), Everything().ToString());
  EXPECT_EQ(CapFeatures(Everything(), IsaTier::kAvx512).ToString(),
            "avx2 fma avx512f avx512bw avx512vnni avx512bf16 avxvnni");
  EXPECT_EQ(CapFeatures(Everything(), IsaTier::kAvx2).ToString(), "avx2 fma avxvnni");
  EXPECT_EQ(CapFeatures(Everything(), IsaTier::kGeneric).ToString(), "generic");
  // A cap above what the CPU has adds nothing.
  CpuFeatures avx2_only;
  avx2_only.avx2 = avx2_only.fma = true;
  EXPECT_EQ(CapFeatures(avx2_only, IsaTier::kAmx).ToString(), "avx2 fma");
}

TEST(CpuFeaturesDeathTest, UnknownCapStopsWithItsName) {
  // A fresh process, whose detection has not run yet.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("MOE_MAX_ISA", "avx3", 1);
        GetCpuFeatures();
      },
      testing::ExitedWithCode(2), "MOE_MAX_ISA=avx3: expected generic, avx2, avx512 or amx");
}

}  // namespace
}  // namespace moe
