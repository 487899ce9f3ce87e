// W8A8 on the bundled trained model: teacher-forced over the held-out text, its top-1 token
// agrees with F32's at >= 97% of positions.
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/deepseek_v3.h"
#include "tokenizer/tokenizer.h"

namespace moe {
namespace {

// Argmax of every position of every window of `window` tokens, BOS prepended.
std::vector<int32_t> TeacherForcedArgmax(const std::string& dir, DType dtype, const std::vector<int32_t>& ids,
                                         int32_t bos, int64_t window) {
  auto model = DeepseekV3Model::Load(dir, dtype);
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (!model.ok()) return {};
  LocalExpertBackend experts;
  const int64_t vocab = (*model)->config().vocab_size;
  std::vector<int32_t> argmax;
  for (size_t begin = 0; begin < ids.size(); begin += window) {
    std::vector<int32_t> input = {bos};
    input.insert(input.end(), ids.begin() + begin, ids.begin() + std::min(ids.size(), begin + window));
    SequenceKvCache cache = (*model)->NewCache(static_cast<int64_t>(input.size()));
    const Tensor hidden = (*model)->Forward(input, cache, AttentionForm::kExpanded, experts);
    const Tensor logits = (*model)->Logits(hidden.data<float>(), hidden.dim(0));
    for (int64_t r = 0; r < hidden.dim(0); ++r) {
      const float* row = logits.data<float>() + r * vocab;
      argmax.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
  }
  return argmax;
}

TEST(DefaultModelAccuracyTest, W8A8Top1AgreesWithF32) {
  const std::string dir = MOE_DEFAULT_MODEL_DIR;
  auto tokenizer = Tokenizer::Load(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  std::ifstream in(dir + "/heldout.txt");
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<int32_t> ids = tokenizer->Encode(text.str(), /*add_bos=*/false);
  ASSERT_GT(ids.size(), 10000u);

  const auto f32 = TeacherForcedArgmax(dir, DType::kF32, ids, *tokenizer->bos_id(), 255);
  const auto w8a8 = TeacherForcedArgmax(dir, DType::kI8, ids, *tokenizer->bos_id(), 255);
  ASSERT_EQ(f32.size(), w8a8.size());
  int64_t same = 0;
  for (size_t i = 0; i < f32.size(); ++i) same += f32[i] == w8a8[i];
  const double agreement = static_cast<double>(same) / f32.size();
  std::printf("w8a8 top-1 agreement with f32: %.4f over %zu positions\n", agreement, f32.size());
  EXPECT_GE(agreement, 0.97);
}

}  // namespace
}  // namespace moe
