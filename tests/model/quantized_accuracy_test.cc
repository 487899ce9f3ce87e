// W8A8 against F32 on the same checkpoint: the logits of every position of a fixed prompt must
// point the same way (cosine similarity). The checkpoints are random tiny models written by
// tools/make_tiny_checkpoint.py in a ctest fixture.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/deepseek_v3.h"

namespace moe {
namespace {

Tensor PromptLogits(const std::string& dir, DType dtype, const std::vector<int32_t>& prompt) {
  auto model = DeepseekV3Model::Load(dir, dtype);
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (!model.ok()) return Tensor();
  LocalExpertBackend experts;
  SequenceKvCache cache = (*model)->NewCache(static_cast<int64_t>(prompt.size()));
  const Tensor hidden = (*model)->Forward(prompt, cache, AttentionForm::kExpanded, experts);
  return (*model)->Logits(hidden.data<float>(), hidden.dim(0));
}

double Cosine(const float* a, const float* b, int64_t n) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t i = 0; i < n; ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  return dot / std::sqrt(na * nb);
}

class QuantizedAccuracyTest : public testing::TestWithParam<std::string> {};

TEST_P(QuantizedAccuracyTest, W8A8LogitsCosineAtLeast0999) {
  const std::string dir = std::string(MOE_TINY_CHECKPOINT_ROOT) + "/" + GetParam();
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 24; ++i) prompt.push_back((i * 37 + 11) % 250);
  const Tensor reference = PromptLogits(dir, DType::kF32, prompt);
  const Tensor quantized = PromptLogits(dir, DType::kI8, prompt);
  ASSERT_FALSE(reference.empty() || quantized.empty());
  const int64_t vocab = reference.dim(1);
  double worst = 1.0, sum = 0;
  const int64_t positions = reference.dim(0);
  for (int64_t t = 0; t < positions; ++t) {
    const double c = Cosine(reference.data<float>() + t * vocab, quantized.data<float>() + t * vocab, vocab);
    worst = std::min(worst, c);
    sum += c;
  }
  std::printf("cosine mean %.6f worst %.6f\n", sum / positions, worst);
  EXPECT_GE(sum / positions, 0.999) << "mean cosine similarity over positions";
}

INSTANTIATE_TEST_SUITE_P(TinyModels, QuantizedAccuracyTest, testing::Values("v3", "v3_no_qlora", "v3_seed23"));

}  // namespace
}  // namespace moe
