// LatentAttention: every ISA variant the machine runs, F32 and BF16 caches, AMLA and the plain
// rescale, one key range or several, against kernels/ref and against each other -- on odd sizes,
// DeepSeek-V3's sizes at a long context, score ranges that force large and clamped rescales, and
// outputs that stay exactly zero.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/latent_attention.h"
#include "kernels/kernels.h"
#include "kernels/ref/ref.h"
#include "random_data.h"

namespace moe::kernels {
namespace {

using cpu::Isa;

std::vector<bf16> ToBf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = F32ToBf16(v[i]);
  return out;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (cpu::IsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

// The elementwise ops an ISA runs (AMX's are AVX-512's).
const cpu::LatentOps& OpsOf(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return cpu::GenericLatentOps();
    case Isa::kAvx2: return cpu::Avx2LatentOps();
    case Isa::kAvx512:
    case Isa::kAmx: break;
  }
  return cpu::Avx512LatentOps();
}

// A problem: queries and an F32 cache (its BF16 twin is the F32 one rounded).
struct Problem {
  LatentAttentionParams p;
  std::vector<float> q_lat, q_pe, c_kv, k_pe;
};

Problem RandomProblem(LatentAttentionParams p, uint32_t seed) {
  Problem pr{p, Random(p.tokens * p.heads * p.kv_lora, seed), Random(p.tokens * p.heads * p.rope, seed + 1),
             Random(p.keys * p.kv_lora, seed + 2), Random(p.keys * p.rope, seed + 3)};
  return pr;
}

enum class CacheType { kF32, kBf16 };

std::vector<float> RunKernel(const Problem& pr, CacheType cache, Isa isa, int64_t splits, SoftmaxRescale rescale) {
  LatentAttentionParams p = pr.p;
  p.rescale = rescale;
  std::vector<float> out(p.tokens * p.heads * p.kv_lora);
  if (cache == CacheType::kF32) {
    cpu::LatentAttention(isa, splits, pr.q_lat.data(), pr.q_pe.data(), pr.c_kv.data(), pr.k_pe.data(), p, out.data());
  } else {
    const std::vector<bf16> c = ToBf16(pr.c_kv), k = ToBf16(pr.k_pe);
    cpu::LatentAttention(isa, splits, pr.q_lat.data(), pr.q_pe.data(), c.data(), k.data(), p, out.data());
  }
  return out;
}

std::vector<float> RunRef(const Problem& pr, CacheType cache) {
  std::vector<float> out(pr.p.tokens * pr.p.heads * pr.p.kv_lora);
  if (cache == CacheType::kF32) {
    ref::LatentAttention(pr.q_lat.data(), pr.q_pe.data(), pr.c_kv.data(), pr.k_pe.data(), pr.p, out.data());
  } else {
    const std::vector<bf16> c = ToBf16(pr.c_kv), k = ToBf16(pr.k_pe);
    ref::LatentAttention(pr.q_lat.data(), pr.q_pe.data(), c.data(), k.data(), pr.p, out.data());
  }
  return out;
}

// Agreement within a tolerance of the output scale: |got - want| <= tolerance * max|want|, as
// each output is an average of cache rows, so its error is on the scale of the rows, not of the
// (possibly cancelling) average itself. The F32 kernels sum in F32 over up to 4K keys and 576-wide
// rows, which costs a few 1e-6 (3.5e-6 at most measured: generic ISA, 4K keys); AMLA and the plain
// rescale differ only in such rounding, so they are held to the same bound. AMX carries the queries
// and the probabilities as two BF16 parts each (16 significant bits): within 2e-5 on these
// problems, up to 1e-4 where scores reach a hundred units (ZeroOutputsStayExactlyZero), measured.
constexpr float kTolerance = 1e-5f;
constexpr float kAmxTolerance = 1e-4f;

float ToleranceOf(Isa isa) { return isa == Isa::kAmx ? kAmxTolerance : kTolerance; }

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                 float tolerance = kTolerance) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 0;
  for (float w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
    ASSERT_NEAR(got[i], want[i], tolerance * scale) << what << " at " << i;
  }
}

// Every variant against ref, and AMLA against the plain rescale.
void CheckAllVariants(const Problem& pr) {
  for (CacheType cache : {CacheType::kF32, CacheType::kBf16}) {
    const std::vector<float> want = RunRef(pr, cache);
    for (Isa isa : SupportedIsas()) {
      for (int64_t splits : {int64_t{1}, int64_t{3}}) {
        const std::string what = std::string(IsaName(isa)) + (cache == CacheType::kF32 ? " f32" : " bf16") +
                                 " cache, splits " + std::to_string(splits);
        const std::vector<float> amla = RunKernel(pr, cache, isa, splits, SoftmaxRescale::kAmla);
        const std::vector<float> plain = RunKernel(pr, cache, isa, splits, SoftmaxRescale::kMultiply);
        const float tolerance = cache == CacheType::kBf16 ? ToleranceOf(isa) : kTolerance;
        ExpectClose(amla, want, what + ", AMLA vs ref", tolerance);
        ExpectClose(plain, want, what + ", plain vs ref", tolerance);
        ExpectClose(amla, plain, what + ", AMLA vs plain", tolerance);
      }
    }
  }
}

TEST(LatentAttentionTest, OddSizesMatchReference) {
  // Sizes off the 16-float lanes and the 64-key tiles, several tokens, a prefix before them.
  for (int64_t q_offset : {0, 9, 130}) {
    const LatentAttentionParams p{.tokens = 3, .keys = q_offset + 3, .heads = 3, .kv_lora = 33, .rope = 6,
                                  .q_offset = q_offset, .scale = 0.2f};
    CheckAllVariants(RandomProblem(p, 13));
  }
}

TEST(LatentAttentionTest, PublicEntryPointsMatchReference) {
  const LatentAttentionParams p{.tokens = 2, .keys = 700, .heads = 5, .kv_lora = 40, .rope = 8,
                                .q_offset = 698, .scale = 0.15f};
  const Problem pr = RandomProblem(p, 21);
  std::vector<float> out(p.tokens * p.heads * p.kv_lora);
  LatentAttention(pr.q_lat.data(), pr.q_pe.data(), pr.c_kv.data(), pr.k_pe.data(), p, out.data());
  ExpectClose(out, RunRef(pr, CacheType::kF32), "f32 cache");
  const std::vector<bf16> c = ToBf16(pr.c_kv), k = ToBf16(pr.k_pe);
  LatentAttention(pr.q_lat.data(), pr.q_pe.data(), c.data(), k.data(), p, out.data());
  ExpectClose(out, RunRef(pr, CacheType::kBf16), "bf16 cache", ToleranceOf(cpu::BestLatentIsa()));
}

TEST(LatentAttentionTest, LongContextAtDeepseekSizes) {
  // One decode token over 4K keys, 16 heads, kv_lora 512, rope 64; the softmax scale of
  // DeepSeek-V3 (1 / sqrt(192)) on unit-variance data gives scores of a few units.
  const LatentAttentionParams p{.tokens = 1, .keys = 4096, .heads = 16, .kv_lora = 512, .rope = 64,
                                .q_offset = 4095, .scale = 0.072f};
  CheckAllVariants(RandomProblem(p, 31));
}

TEST(LatentAttentionTest, LargeScoreRanges) {
  // Scores with a spread of tens to hundreds of units, in random order: the running max jumps by
  // large steps early on, and most probabilities underflow.
  const LatentAttentionParams p{.tokens = 2, .keys = 1000, .heads = 4, .kv_lora = 48, .rope = 16,
                                .q_offset = 998, .scale = 1.0f};
  for (float spread : {3.0f, 30.0f}) {
    Problem pr = RandomProblem(p, 41);
    for (float& x : pr.q_pe) x *= spread;
    CheckAllVariants(pr);
  }
}

TEST(LatentAttentionTest, RisingScoresRescaleEveryTile) {
  // Score of key s = slope * s: each tile raises the max, by ~9 (mild) or ~460 (clamped) in
  // base 2, so every tile rescales and, in the steep case, flushes all that came before.
  const LatentAttentionParams p{.tokens = 1, .keys = 640, .heads = 2, .kv_lora = 32, .rope = 16,
                                .q_offset = 639, .scale = 1.0f};
  for (float slope : {0.1f, 5.0f}) {
    Problem pr = RandomProblem(p, 51);
    std::fill(pr.q_lat.begin(), pr.q_lat.end(), 0.0f);
    std::fill(pr.q_pe.begin(), pr.q_pe.end(), 0.0f);
    pr.q_pe[0] = 1.0f;
    pr.q_pe[p.rope] = -0.5f;  // the second head's scores fall instead: no rescale at all
    for (int64_t s = 0; s < p.keys; ++s) pr.k_pe[s * p.rope] = slope * static_cast<float>(s);
    CheckAllVariants(pr);
  }
}

TEST(LatentAttentionTest, ZeroOutputsStayExactlyZero) {
  // Cache columns that are zero in every row keep a zero accumulator through every rescale: the
  // exponent add must leave it zero, not turn it into -Inf or a NaN.
  const LatentAttentionParams p{.tokens = 1, .keys = 900, .heads = 3, .kv_lora = 40, .rope = 8,
                                .q_offset = 899, .scale = 1.0f};
  Problem pr = RandomProblem(p, 61);
  for (float& x : pr.q_pe) x *= 10.0f;  // many rescales
  for (int64_t s = 0; s < p.keys; ++s) {
    for (int64_t i : {0, 7, 39}) pr.c_kv[s * p.kv_lora + i] = 0.0f;
  }
  for (Isa isa : SupportedIsas()) {
    for (CacheType cache : {CacheType::kF32, CacheType::kBf16}) {
      for (int64_t splits : {int64_t{1}, int64_t{4}}) {
        const std::vector<float> out = RunKernel(pr, cache, isa, splits, SoftmaxRescale::kAmla);
        for (int64_t h = 0; h < p.heads; ++h) {
          for (int64_t i : {0, 7, 39}) EXPECT_EQ(out[h * p.kv_lora + i], 0.0f) << IsaName(isa) << " head " << h;
        }
      }
    }
  }
  CheckAllVariants(pr);
}

TEST(LatentAttentionTest, TokensDoNotDependOnTheirBatch) {
  // A token's output is the same bits whether it runs alone (decode), inside a chunk of any size
  // and offset (prefill), with the work split over tokens, over key ranges or (alone, one range)
  // over its heads: where its keys are cut depends only on how many it sees. Lengths from one range to kMaxKeyRanges of them.
  const int64_t keys = 4700;
  LatentAttentionParams all{.tokens = keys, .keys = keys, .heads = 3, .kv_lora = 40, .rope = 8,
                            .q_offset = 0, .scale = 0.3f};
  const Problem pr = RandomProblem(all, 71);
  const std::vector<bf16> c = ToBf16(pr.c_kv), k = ToBf16(pr.k_pe);
  const int64_t row = all.heads * all.kv_lora;
  // Rows [first, first + tokens) of the queries as one call.
  auto run = [&](Isa isa, int64_t splits, int64_t first, int64_t tokens) {
    LatentAttentionParams p = all;
    p.tokens = tokens;
    p.q_offset = first;
    std::vector<float> out(tokens * row);
    cpu::LatentAttention(isa, splits, pr.q_lat.data() + first * all.heads * all.kv_lora,
                         pr.q_pe.data() + first * all.heads * all.rope, c.data(), k.data(), p, out.data());
    return out;
  };
  for (Isa isa : SupportedIsas()) {
    for (int64_t position : {0, 255, 300, 511, 512, 700, 1023, 2000, 4095, 4096, 4699}) {
      const std::vector<float> alone = run(isa, 1, position, 1);
      for (int64_t splits : {int64_t{2}, int64_t{16}}) {
        EXPECT_EQ(run(isa, splits, position, 1), alone) << IsaName(isa) << " position " << position << " splits " << splits;
      }
      for (int64_t before : {int64_t{1}, int64_t{5}, int64_t{17}}) {
        const int64_t first = std::max<int64_t>(0, position - before);
        const int64_t tokens = std::min(keys - first, position - first + 2);
        for (int64_t splits : {int64_t{1}, int64_t{4}}) {
          const std::vector<float> chunk = run(isa, splits, first, tokens);
          const std::vector<float> mine(chunk.begin() + (position - first) * row,
                                        chunk.begin() + (position - first + 1) * row);
          EXPECT_EQ(mine, alone) << IsaName(isa) << " position " << position << " in a chunk from " << first
                                 << " of " << tokens << ", splits " << splits;
        }
      }
    }
  }
}

TEST(LatentAttentionTest, PagedCacheGivesTheSameBits) {
  // Keys read through a block table, from blocks scattered over a larger cache whose other blocks
  // hold NaN, are the same bits as the keys laid out in order, on every variant and work split;
  // with rows of whole AMX steps (kv_lora and rope multiples of 32) the AMX kernel reads tiles of
  // 16 keys in a block where they lie, and copies the others (blocks of 5, the last partial tile).
  for (const auto& [block_size, kv_lora, rope] :
       {std::tuple<int64_t, int64_t, int64_t>{16, 40, 8}, {5, 40, 8}, {16, 64, 32}, {32, 64, 32}, {5, 64, 32}}) {
    const LatentAttentionParams in_order{.tokens = 3, .keys = 700, .heads = 3, .kv_lora = kv_lora, .rope = rope,
                                         .q_offset = 697, .scale = 0.3f};
    const Problem pr = RandomProblem(in_order, 91);
    const int64_t blocks = (in_order.keys + block_size - 1) / block_size, spare = 7;
    std::vector<int32_t> table(blocks + spare);
    for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
    std::shuffle(table.begin(), table.end(), std::mt19937(92));
    table.resize(blocks);
    Problem paged = pr;
    const int64_t rows = (blocks + spare) * block_size;
    paged.c_kv.assign(rows * in_order.kv_lora, std::numeric_limits<float>::quiet_NaN());
    paged.k_pe.assign(rows * in_order.rope, std::numeric_limits<float>::quiet_NaN());
    paged.p.block_table = table.data();
    paged.p.block_size = block_size;
    for (int64_t key = 0; key < in_order.keys; ++key) {
      const int64_t row = paged.p.CacheRow(key);
      std::copy_n(&pr.c_kv[key * in_order.kv_lora], in_order.kv_lora, &paged.c_kv[row * in_order.kv_lora]);
      std::copy_n(&pr.k_pe[key * in_order.rope], in_order.rope, &paged.k_pe[row * in_order.rope]);
    }
    for (CacheType cache : {CacheType::kF32, CacheType::kBf16}) {
      EXPECT_EQ(RunRef(paged, cache), RunRef(pr, cache)) << "ref, block size " << block_size << ", kv_lora " << kv_lora;
      for (Isa isa : SupportedIsas()) {
        for (int64_t splits : {int64_t{1}, int64_t{3}}) {
          EXPECT_EQ(RunKernel(paged, cache, isa, splits, SoftmaxRescale::kAmla),
                    RunKernel(pr, cache, isa, splits, SoftmaxRescale::kAmla))
              << IsaName(isa) << (cache == CacheType::kF32 ? " f32" : " bf16") << " cache, splits " << splits
              << ", block size " << block_size << ", kv_lora " << kv_lora << ", rope " << rope;
        }
      }
    }
  }
}

// --- The ops of each ISA on their own --------------------------------------------------------------

TEST(LatentOpsTest, ScalePow2IsExactWithFlushToZero) {
  const float denormal = std::numeric_limits<float>::denorm_min() * 12345;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 3.5f, -1e-30f, FLT_MIN, -FLT_MIN * 3, denormal,
                               FLT_MAX, -FLT_MAX, inf, -inf, 6e-37f, 1e20f, -2.5e-20f};
  while (values.size() < 37) values.push_back(static_cast<float>(values.size()) * -0.37f);  // a masked tail
  for (Isa isa : SupportedIsas()) {
    const cpu::LatentOps& ops = OpsOf(isa);
    for (int32_t shift : {0, -1, -3, -30, -100, -126, -200, -254, -255}) {
      std::vector<float> x = values;
      x.push_back(std::numeric_limits<float>::quiet_NaN());
      ops.scale_pow2(x.data(), static_cast<int64_t>(x.size()), shift);
      for (size_t i = 0; i < values.size(); ++i) {
        const float v = values[i];
        // The exact product, zero where it falls below the normal range; infinities stay.
        const double exact = std::ldexp(static_cast<double>(v), shift);
        const float want = std::isinf(v) ? v : std::fabs(exact) < FLT_MIN ? 0.0f : static_cast<float>(exact);
        EXPECT_EQ(x[i], want) << IsaName(isa) << ": " << v << " * 2^" << shift;
      }
      EXPECT_TRUE(std::isnan(x.back())) << IsaName(isa);
    }
  }
}

TEST(LatentOpsTest, Exp2SumMatchesLibm) {
  std::vector<float> x(37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -150.0f + 4.1f * static_cast<float>(i);  // to +1.7
  for (Isa isa : SupportedIsas()) {
    const cpu::LatentOps& ops = OpsOf(isa);
    std::vector<float> p = x;
    const float sum = ops.exp2_sum(p.data(), static_cast<int64_t>(p.size()), 0.5f);
    double want_sum = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp2(static_cast<double>(x[i]) - 0.5);
      want_sum += want;
      // Two float ulps, and denormal results to their absolute step.
      EXPECT_NEAR(p[i], want, 2.5e-7 * want + 1.5e-45) << IsaName(isa) << " at x = " << x[i];
    }
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum) << IsaName(isa);
  }
}

}  // namespace
}  // namespace moe::kernels
