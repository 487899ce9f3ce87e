// Runs under mpirun (ctest starts it with 1, 2 and 3 ranks): every rank checks that the expert-
// parallel backend gives its tokens what one process gives them, for every wire format, exchange
// and shared-expert layout, and that the bytes crossing the links are the ones the layout implies.
#include "model/expert_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <tuple>

#include "../kernels/random_data.h"

namespace moe {
namespace {

constexpr int64_t kHidden = 256, kWidth = 64, kExperts = 8, kTopK = 3;

Linear RandomLinear(int64_t out, int64_t in, uint32_t seed, DType dtype) {
  Tensor w = Tensor::F32({out, in});
  const std::vector<float> v = kernels::Random(out * in, seed, 0.1f);
  std::copy(v.begin(), v.end(), w.data<float>());
  return MakeLinear(std::move(w), dtype);
}

// The same weights on every rank (fixed seeds); each runs only the experts the placement gives it.
MoeWeights RandomMoe(DType dtype) {
  MoeWeights w;
  w.router = Tensor::F32({kExperts, kHidden});  // the backend reads only its shape
  uint32_t seed = 100;
  auto mlp = [&] {
    MlpWeights m;
    m.gate = RandomLinear(kWidth, kHidden, seed++, dtype);
    m.up = RandomLinear(kWidth, kHidden, seed++, dtype);
    m.down = RandomLinear(kHidden, kWidth, seed++, dtype);
    return m;
  };
  for (int64_t e = 0; e < kExperts; ++e) w.experts.push_back(mlp());
  w.shared = mlp();
  return w;
}

struct Tokens {
  int64_t count = 0;
  std::vector<float> x;          // [count, kHidden]
  std::vector<int32_t> ids;      // [count, kTopK], distinct per token
  std::vector<float> weights;    // [count, kTopK]
};

// Ranks differ in load, and rank 1 has no tokens at all (it must still take part).
Tokens RankTokens(int rank) {
  Tokens t;
  t.count = rank == 1 ? 0 : 6 + rank;
  t.x = kernels::Random(t.count * kHidden, 7 + rank);
  std::mt19937 rng(11 + rank);
  for (int64_t i = 0; i < t.count; ++i) {
    std::set<int32_t> chosen;
    while (static_cast<int64_t>(chosen.size()) < kTopK) chosen.insert(static_cast<int32_t>(rng() % kExperts));
    std::vector<int32_t> slots(chosen.begin(), chosen.end());
    std::shuffle(slots.begin(), slots.end(), rng);
    t.ids.insert(t.ids.end(), slots.begin(), slots.end());
    for (int64_t j = 0; j < kTopK; ++j) t.weights.push_back(0.1f + static_cast<float>(rng() % 100) / 100.0f);
  }
  return t;
}

std::vector<float> RunLocal(const MoeWeights& moe, const Tokens& t) {
  std::vector<float> out(t.count * kHidden);
  LocalExpertBackend local;
  local.Run(moe, t.x.data(), t.count, t.ids.data(), t.weights.data(), kTopK, out.data());
  return out;
}

DType DTypeOf(ActivationWire wire) {
  switch (wire) {
    case ActivationWire::kInt8: return DType::kI8;
    case ActivationWire::kBF16: return DType::kBF16;
    default: return DType::kF32;
  }
}

// (wire, exchange, shared experts on a dedicated rank, two micro-batches started before either
// finishes, as the model runs them with two-batch overlap)
class ExpertParallelTest : public testing::TestWithParam<std::tuple<ActivationWire, MoeExchange, bool, bool>> {};

TEST_P(ExpertParallelTest, GivesEveryTokenWhatOneProcessGives) {
  const auto [wire, exchange, dedicated_shared_rank, overlap] = GetParam();
  auto comm = MakeMpiCommunicator();
  // One rank cannot be both the routed-expert rank and a dedicated shared-expert rank: that layout
  // is checked by the runs with 2 and 3 ranks.
  if (dedicated_shared_rank && comm->size() == 1) return;
  auto placement = ExpertPlacement::Contiguous(kExperts, comm->size(), dedicated_shared_rank ? 1 : 0);
  ASSERT_TRUE(placement.ok()) << placement.status().message();
  const MoeWeights moe = RandomMoe(DTypeOf(wire));
  const Tokens tokens = RankTokens(comm->rank());
  ExpertParallelBackend backend(*comm, *placement, exchange, wire, overlap ? 2 : 1);
  std::vector<float> out(tokens.count * kHidden);
  const int parts = backend.micro_batches();
  auto begin = [&](int p) { return tokens.count * p / parts; };
  std::vector<std::unique_ptr<PendingExperts>> pending;
  for (int p = 0; p < parts; ++p) {
    pending.push_back(backend.Start(moe, tokens.x.data() + begin(p) * kHidden, begin(p + 1) - begin(p),
                                    tokens.ids.data() + begin(p) * kTopK, tokens.weights.data() + begin(p) * kTopK,
                                    kTopK));
  }
  for (int p = 0; p < parts; ++p) pending[p]->Finish(out.data() + begin(p) * kHidden);
  const std::vector<float> want = RunLocal(moe, tokens);
  if (wire == ActivationWire::kInt8) {
    // Integer GEMMs do not depend on the rows beside a token: the same bits.
    EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0) << "rank " << comm->rank();
  } else {
    // Floating-point GEMMs may sum in another order for another number of rows.
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-4f * (1 + std::abs(want[i]))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertParallelTest,
                         testing::Combine(testing::Values(ActivationWire::kInt8, ActivationWire::kBF16,
                                                          ActivationWire::kF32),
                                          testing::Values(MoeExchange::kAllToAll, MoeExchange::kAllGatherReduceScatter),
                                          testing::Bool(), testing::Bool()));

int64_t WireRowBytes(ActivationWire wire) {
  switch (wire) {
    case ActivationWire::kInt8: return kHidden + int64_t{sizeof(float)};  // INT8 values and a scale
    case ActivationWire::kBF16: return kHidden * 2;
    default: return kHidden * int64_t{sizeof(float)};
  }
}

int64_t SumOverRanks(Communicator& comm, int64_t value) {
  int64_t sum = 0;
  for (int64_t v : comm.AllGather(value)) sum += v;
  return sum;
}

// All-to-all: a token goes once to each other rank owning one of its experts, as its activation
// row and its routing; each expert output comes back as kHidden floats. Summed over the ranks,
// the bytes sent in one MoE layer match that count exactly, and INT8 rows cost about half of BF16.
TEST(ExpertParallelBytes, MatchTheAnalyticalCountAndInt8HalvesBf16) {
  // The same on every rank, so that all skip or none.
  auto comm = MakeMpiCommunicator();
  auto placement = ExpertPlacement::Contiguous(kExperts, comm->size());
  ASSERT_TRUE(placement.ok());
  const Tokens tokens = RankTokens(comm->rank());
  int64_t remote_rows = 0, remote_slots = 0;
  for (int64_t t = 0; t < tokens.count; ++t) {
    std::set<int> ranks;
    for (int64_t j = 0; j < kTopK; ++j) {
      const int owner = placement->owner(tokens.ids[t * kTopK + j], comm->rank());
      ranks.insert(owner);
      remote_slots += owner != comm->rank();
    }
    remote_rows += static_cast<int64_t>(ranks.size()) - ranks.count(comm->rank());
  }
  const int64_t tokens_total = SumOverRanks(*comm, tokens.count);
  const int64_t rows_total = SumOverRanks(*comm, remote_rows), slots_total = SumOverRanks(*comm, remote_slots);
  const int64_t combine = slots_total * kHidden * int64_t{sizeof(float)};
  int64_t dispatch[2] = {0, 0};
  for (ActivationWire wire : {ActivationWire::kInt8, ActivationWire::kBF16}) {
    const MoeWeights moe = RandomMoe(DTypeOf(wire));
    ExpertParallelBackend backend(*comm, *placement, MoeExchange::kAllToAll, wire);
    std::vector<float> out(tokens.count * kHidden);
    const int64_t before = comm->bytes_sent();
    backend.Run(moe, tokens.x.data(), tokens.count, tokens.ids.data(), tokens.weights.data(), kTopK, out.data());
    const int64_t sent = SumOverRanks(*comm, comm->bytes_sent() - before);
    const int64_t expected_dispatch = rows_total * (WireRowBytes(wire) + kTopK * int64_t{sizeof(int32_t)});
    EXPECT_EQ(sent, expected_dispatch + combine) << (wire == ActivationWire::kInt8 ? "INT8" : "BF16");
    dispatch[wire == ActivationWire::kInt8 ? 0 : 1] = sent - combine;
  }
  if (comm->rank() == 0 && tokens_total > 0) {
    std::cout << "dispatch bytes per token per MoE layer: INT8 " << dispatch[0] / static_cast<double>(tokens_total)
              << ", BF16 " << dispatch[1] / static_cast<double>(tokens_total) << " (hidden " << kHidden << ", "
              << comm->size() << " ranks)\n";
  }
  if (comm->size() > 1) {
    EXPECT_GT(dispatch[0], 0);
    EXPECT_LT(static_cast<double>(dispatch[0]) / static_cast<double>(dispatch[1]), 0.55);
  }
}

}  // namespace
}  // namespace moe
