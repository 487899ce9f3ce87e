// Runs under mpirun with any number of ranks (ctest starts it with 1, 2 and 4): every rank checks
// that its tokens' expert results come back exactly, through both exchanges, with the bytes the
// layout implies.
#include "dist/moe_dispatch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

namespace moe {
namespace {

constexpr int64_t kExperts = 10, kTopK = 3, kDim = 5;

// What "expert e" makes of a row: distinct per expert and row, so misrouting shows.
float ExpertResult(int32_t expert, float x, int64_t d) { return x * static_cast<float>(expert + 1) + static_cast<float>(d); }

struct LocalTokens {
  std::vector<int32_t> expert_ids;  // [tokens, k], distinct per token
  std::vector<float> values;        // one float per token: its "activation"
};

LocalTokens MakeTokens(int rank, int64_t tokens) {
  std::mt19937 rng(1234 + rank);
  LocalTokens t;
  for (int64_t i = 0; i < tokens; ++i) {
    std::set<int32_t> chosen;
    while (static_cast<int64_t>(chosen.size()) < kTopK) chosen.insert(static_cast<int32_t>(rng() % kExperts));
    std::vector<int32_t> slots(chosen.begin(), chosen.end());
    std::shuffle(slots.begin(), slots.end(), rng);  // slot order is not expert order
    t.expert_ids.insert(t.expert_ids.end(), slots.begin(), slots.end());
    t.values.push_back(static_cast<float>(rank * 1000 + i) + 0.25f);
  }
  return t;
}

void CheckRoundTrip(MoeExchange exchange, int64_t tokens_per_rank) {
  auto comm = MakeMpiCommunicator();
  auto placement = ExpertPlacement::Contiguous(kExperts, comm->size());
  ASSERT_TRUE(placement.ok());
  // Ranks differ in load; rank 1 has none at all (it must still take part).
  const int64_t tokens = comm->rank() == 1 ? 0 : tokens_per_rank + comm->rank();
  const LocalTokens local = MakeTokens(comm->rank(), tokens);
  MoeDispatcher dispatcher(*comm, *placement);
  const MoeLayout layout = dispatcher.Layout(exchange, local.expert_ids.data(), tokens, kTopK);
  const std::vector<uint8_t> tags(tokens, static_cast<uint8_t>(comm->rank()));
  const RowPayload payloads[] = {{reinterpret_cast<const uint8_t*>(local.values.data()), sizeof(float)},
                                 {tags.data(), 1}};
  const DispatchedTokens got = dispatcher.Dispatch(layout, payloads);
  ASSERT_EQ(got.payloads.size(), 2u);

  std::vector<float> results(got.rows * kTopK * kDim, -1.0f);
  for (int64_t row = 0; row < got.rows; ++row) {
    float x;
    std::memcpy(&x, &got.payloads[0][row * sizeof(float)], sizeof(float));
    for (int64_t j = 0; j < kTopK; ++j) {
      const int32_t e = got.expert_ids[row * kTopK + j];
      if (e < 0) continue;
      EXPECT_EQ(placement->owner(e, comm->rank()), comm->rank()) << "a slot of another rank's expert arrived";
      for (int64_t d = 0; d < kDim; ++d) results[(row * kTopK + j) * kDim + d] = ExpertResult(e, x, d);
    }
  }
  const std::vector<float> out = dispatcher.Combine(layout, got, results.data(), kDim);
  ASSERT_EQ(static_cast<int64_t>(out.size()), tokens * kTopK * kDim);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < kTopK; ++j) {
      for (int64_t d = 0; d < kDim; ++d) {
        ASSERT_EQ(out[(t * kTopK + j) * kDim + d], ExpertResult(local.expert_ids[t * kTopK + j], local.values[t], d))
            << "rank " << comm->rank() << " token " << t << " slot " << j;
      }
    }
  }
}

TEST(MoeDispatch, AllToAllReturnsEveryExpertOutputToItsToken) { CheckRoundTrip(MoeExchange::kAllToAll, 7); }

TEST(MoeDispatch, AllGatherReduceScatterReturnsEveryExpertOutputToItsToken) {
  CheckRoundTrip(MoeExchange::kAllGatherReduceScatter, 7);
}

// Dispatch sends each token once to every other rank that owns one of its experts: its payload
// bytes plus k routing ids. Nothing else crosses the links.
TEST(MoeDispatch, AllToAllDispatchSendsTheAnalyticalBytes) {
  auto comm = MakeMpiCommunicator();
  auto placement = ExpertPlacement::Contiguous(kExperts, comm->size());
  ASSERT_TRUE(placement.ok());
  const int64_t tokens = 9, row_bytes = 64 + 4;  // like 64 INT8 activations and a float scale
  const LocalTokens local = MakeTokens(comm->rank(), tokens);
  int64_t expected = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    std::set<int> ranks;
    for (int64_t j = 0; j < kTopK; ++j) ranks.insert(placement->owner(local.expert_ids[t * kTopK + j], comm->rank()));
    ranks.erase(comm->rank());
    expected += static_cast<int64_t>(ranks.size()) * (row_bytes + kTopK * 4);
  }
  MoeDispatcher dispatcher(*comm, *placement);
  const MoeLayout layout = dispatcher.Layout(MoeExchange::kAllToAll, local.expert_ids.data(), tokens, kTopK);
  const std::vector<uint8_t> rows(tokens * row_bytes, 7);
  const RowPayload payload{rows.data(), row_bytes};
  const int64_t before = comm->bytes_sent();
  dispatcher.Dispatch(layout, std::span(&payload, 1));
  EXPECT_EQ(comm->bytes_sent() - before, expected);
}

TEST(ExpertPlacement, SpreadsContiguouslyAndRefusesTooManyRanks) {
  auto p = ExpertPlacement::Contiguous(10, 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->experts_of(0), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(p->experts_of(1), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(p->experts_of(2), (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(p->experts_of(3), (std::vector<int32_t>{8, 9}));
  EXPECT_FALSE(ExpertPlacement::Contiguous(3, 4).ok());
}

TEST(ExpertPlacement, DedicatedSharedExpertRanksServeTheHomeRanksInTurn) {
  auto p = ExpertPlacement::Contiguous(10, 5, 2);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->experts_of(0), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(p->experts_of(2), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_TRUE(p->experts_of(3).empty());
  EXPECT_EQ(p->owner(p->shared_expert_id(), 0), 3);
  EXPECT_EQ(p->owner(p->shared_expert_id(), 1), 4);
  EXPECT_EQ(p->owner(p->shared_expert_id(), 2), 3);
  EXPECT_TRUE(p->runs_shared_experts(4));
  EXPECT_FALSE(p->runs_shared_experts(2));
  EXPECT_FALSE(ExpertPlacement::Contiguous(10, 2, 2).ok());
  EXPECT_FALSE(ExpertPlacement::Contiguous(2, 4, 1).ok());
}

}  // namespace
}  // namespace moe
