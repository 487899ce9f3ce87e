// Under W8A8 a token's hidden state and logits are the same bits however its sequence is chunked
// and whatever else shares the batch: here three sequences (600, 300 and 50 tokens, of which 400,
// 300 and 20 are prompt) run once each as one chunk over blocks in order, then in chunks of 1 to
// 70 tokens, batched together in varying orders over shuffled blocks, and every row is compared.
// This holds because a position's attention form goes by whether it is a prompt position, both
// attention kernels tile keys from position 0 whoever asks, INT8 GEMMs sum exactly and the router
// and lm_head sum in a fixed order. (The engine-level version, with the
// scheduler's chunking, prefix caching and preemption, is tests/engine/engine_test.cc.)
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/deepseek_v3.h"

namespace moe {
namespace {

struct Sequence {
  std::vector<int32_t> tokens;
  int64_t prompt_tokens = 0;
  std::vector<int32_t> block_table;
};

bool SameRow(const Tensor& a, int64_t row_a, const Tensor& b, int64_t row_b) {
  const int64_t width = a.dim(1);
  return std::memcmp(a.data<float>() + row_a * width, b.data<float>() + row_b * width, width * sizeof(float)) == 0;
}

TEST(BatchInvarianceTest, W8a8RowsDoNotDependOnChunkingOrBatch) {
  auto loaded = DeepseekV3Model::Load(std::string(MOE_TINY_CHECKPOINT_ROOT) + "/v3", DType::kI8);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const DeepseekV3Model& model = **loaded;
  LocalExpertBackend experts;
  constexpr int64_t kBlockSize = 16;
  std::mt19937 rng(7);

  std::vector<Sequence> sequences(3);
  const int64_t lengths[] = {600, 300, 50}, prompts[] = {400, 300, 20};
  int64_t total_blocks = 0;
  for (size_t s = 0; s < sequences.size(); ++s) {
    sequences[s].tokens.resize(lengths[s]);
    sequences[s].prompt_tokens = prompts[s];
    for (int32_t& t : sequences[s].tokens) t = static_cast<int32_t>(rng() % model.config().vocab_size);
    total_blocks += (lengths[s] + kBlockSize - 1) / kBlockSize;
  }

  // Alone: each sequence as one chunk, its blocks in order from 0.
  std::vector<Tensor> hidden_alone, logits_alone;
  for (const Sequence& s : sequences) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    std::vector<int32_t> table((n + kBlockSize - 1) / kBlockSize);
    std::iota(table.begin(), table.end(), 0);
    PagedKvCache cache = model.NewPagedCache(static_cast<int64_t>(table.size()), kBlockSize);
    const SequenceChunk chunk{s.tokens, 0, table, s.prompt_tokens};
    hidden_alone.push_back(model.Forward(std::span(&chunk, 1), cache, experts));
    logits_alone.push_back(model.Logits(hidden_alone.back().data<float>(), n));
  }

  // Together: blocks shuffled among the sequences; each step takes a chunk of 1 to 70 tokens (one
  // token a third of the time) from every unfinished sequence, in a shuffled order.
  std::vector<int32_t> blocks(total_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (size_t s = 0, next = 0; s < sequences.size(); ++s) {
    const size_t count = (sequences[s].tokens.size() + kBlockSize - 1) / kBlockSize;
    sequences[s].block_table.assign(blocks.begin() + next, blocks.begin() + next + count);
    next += count;
  }
  PagedKvCache cache = model.NewPagedCache(total_blocks, kBlockSize);
  std::vector<int64_t> done(sequences.size(), 0);
  int64_t compared = 0, differing_hidden = 0, differing_logits = 0, one_token_chunks = 0;
  for (int step = 0; step < 1000; ++step) {
    std::vector<size_t> order;
    for (size_t s = 0; s < sequences.size(); ++s) {
      if (done[s] < static_cast<int64_t>(sequences[s].tokens.size())) order.push_back(s);
    }
    if (order.empty()) break;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<SequenceChunk> chunks;
    std::vector<std::pair<size_t, int64_t>> rows;  // (sequence, position) of each row
    for (size_t s : order) {
      const int64_t left = static_cast<int64_t>(sequences[s].tokens.size()) - done[s];
      const int64_t n = std::min<int64_t>(left, rng() % 3 == 0 ? 1 : 1 + rng() % 70);
      one_token_chunks += n == 1;
      chunks.push_back({std::span(sequences[s].tokens).subspan(done[s], n), done[s], sequences[s].block_table,
                        sequences[s].prompt_tokens});
      for (int64_t i = 0; i < n; ++i) rows.push_back({s, done[s] + i});
      done[s] += n;
    }
    const Tensor hidden = model.Forward(chunks, cache, experts);
    const Tensor logits = model.Logits(hidden.data<float>(), hidden.dim(0));
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto [s, position] = rows[r];
      differing_hidden += !SameRow(hidden, static_cast<int64_t>(r), hidden_alone[s], position);
      differing_logits += !SameRow(logits, static_cast<int64_t>(r), logits_alone[s], position);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 950);
  EXPECT_GT(one_token_chunks, 10);
  EXPECT_EQ(differing_hidden, 0) << "of " << compared << " rows";
  EXPECT_EQ(differing_logits, 0) << "of " << compared << " rows";
}

}  // namespace
}  // namespace moe
