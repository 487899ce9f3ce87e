#include "model/checkpoint.h"

#include <cmath>

#include <gtest/gtest.h>

#include "test_files.h"

namespace moe {
namespace {

using test::Bytes;
using test::ExpectError;
using test::RawSafetensors;
using test::Safetensors;
using test::TempDir;
using test::TensorBytes;

class CheckpointTest : public ::testing::Test {
 protected:
  // Writes `tensors` as dir/model.safetensors and opens the directory.
  Checkpoint OpenSingle(const std::vector<TensorBytes>& tensors) {
    dir_.Write("model.safetensors", Safetensors(tensors));
    auto checkpoint = Checkpoint::Open(dir_.path());
    MOE_CHECK(checkpoint.ok(), "%s", checkpoint.status().message().c_str());
    return std::move(checkpoint).value();
  }

  TempDir dir_;
};

std::vector<float> AsF32(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kF32);
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

std::vector<uint16_t> Bf16Bits(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kBF16);
  std::vector<uint16_t> bits;
  for (int64_t i = 0; i < t.numel(); ++i) bits.push_back(t.data<bf16>()[i].bits);
  return bits;
}

TEST_F(CheckpointTest, MissingDirectory) {
  const std::string dir = dir_.path() + "/absent";
  ExpectError(Checkpoint::Open(dir), {dir, "no such directory"});
}

TEST_F(CheckpointTest, PathIsAFile) {
  const std::string file = dir_.Write("config.json", "{}");
  ExpectError(Checkpoint::Open(file), {file, "not a directory"});
}

TEST_F(CheckpointTest, DirectoryWithoutWeights) {
  ExpectError(Checkpoint::Open(dir_.path()),
              {dir_.path(), "model.safetensors.index.json", "model.safetensors"});
}

TEST_F(CheckpointTest, CorruptSingleFile) {
  dir_.Write("model.safetensors", RawSafetensors("{not json", ""));
  ExpectError(Checkpoint::Open(dir_.path()), {"model.safetensors", "not valid JSON"});
}

TEST_F(CheckpointTest, ListsTensors) {
  Checkpoint ckpt = OpenSingle(
      {{"b", "F32", {1}, Bytes(std::vector<float>{1})}, {"a", "F32", {1}, Bytes(std::vector<float>{2})}});
  EXPECT_TRUE(ckpt.Has("a"));
  EXPECT_FALSE(ckpt.Has("c"));
  EXPECT_EQ(ckpt.TensorNames(), (std::vector<std::string>{"a", "b"}));
}

TEST_F(CheckpointTest, MissingTensor) {
  Checkpoint ckpt = OpenSingle({{"a", "F32", {1}, Bytes(std::vector<float>{1})}});
  ExpectError(ckpt.Load("model.norm.weight", {1}, DType::kF32),
              {dir_.path() + ": missing tensor 'model.norm.weight'"});
}

TEST_F(CheckpointTest, WrongShape) {
  Checkpoint ckpt = OpenSingle({{"w", "F32", {2, 3}, Bytes(std::vector<float>(6))}});
  ExpectError(ckpt.Load("w", {3, 2}, DType::kF32),
              {"model.safetensors", "tensor 'w'", "shape [2, 3], expected [3, 2]"});
}

TEST_F(CheckpointTest, IntegerTensorDoesNotConvertToFloat) {
  Checkpoint ckpt = OpenSingle({{"q", "I8", {4}, "\x01\x02\x03\x04"}});
  ExpectError(ckpt.Load("q", {4}, DType::kF32),
              {"model.safetensors", "tensor 'q'", "I8 cannot be converted to F32"});
  auto same = ckpt.Load("q", {4}, DType::kI8);
  ASSERT_TRUE(same.ok()) << same.status().message();
  EXPECT_EQ(same->data<int8_t>()[3], 4);
}

TEST_F(CheckpointTest, F32ToF32AndBf16) {
  // 1 + 2^-8 is halfway between two bf16 values and rounds to even (down); 1 + 3 * 2^-8 rounds up.
  const std::vector<float> values = {1.0f, -2.5f, 1.00390625f, 1.01171875f};
  Checkpoint ckpt = OpenSingle({{"w", "F32", {2, 2}, Bytes(values)}});
  auto f32 = ckpt.Load("w", {2, 2}, DType::kF32);
  ASSERT_TRUE(f32.ok()) << f32.status().message();
  EXPECT_EQ(AsF32(*f32), values);
  auto b16 = ckpt.Load("w", {2, 2}, DType::kBF16);
  ASSERT_TRUE(b16.ok()) << b16.status().message();
  EXPECT_EQ(Bf16Bits(*b16), (std::vector<uint16_t>{0x3f80, 0xc020, 0x3f80, 0x3f82}));
}

TEST_F(CheckpointTest, Bf16ToF32AndBf16) {
  const std::vector<uint16_t> bits = {0x3fc0, 0xc000, 0x7f80, 0x0001};
  Checkpoint ckpt = OpenSingle({{"w", "BF16", {4}, Bytes(bits)}});
  auto f32 = ckpt.Load("w", {4}, DType::kF32);
  ASSERT_TRUE(f32.ok()) << f32.status().message();
  EXPECT_EQ(AsF32(*f32), (std::vector<float>{1.5f, -2.0f, INFINITY, std::ldexp(1.0f, -133)}));
  auto b16 = ckpt.Load("w", {4}, DType::kBF16);
  ASSERT_TRUE(b16.ok()) << b16.status().message();
  EXPECT_EQ(Bf16Bits(*b16), bits);
}

TEST_F(CheckpointTest, F16ToF32AndBf16) {
  // 1.5, -2, the largest half, the smallest subnormal half, +inf.
  const std::vector<uint16_t> bits = {0x3e00, 0xc000, 0x7bff, 0x0001, 0x7c00};
  Checkpoint ckpt = OpenSingle({{"w", "F16", {5}, Bytes(bits)}});
  auto f32 = ckpt.Load("w", {5}, DType::kF32);
  ASSERT_TRUE(f32.ok()) << f32.status().message();
  EXPECT_EQ(AsF32(*f32), (std::vector<float>{1.5f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), INFINITY}));
  auto b16 = ckpt.Load("w", {5}, DType::kBF16);
  ASSERT_TRUE(b16.ok()) << b16.status().message();
  EXPECT_EQ(Bf16Bits(*b16)[0], 0x3fc0);
}

TEST_F(CheckpointTest, UnalignedTensorData) {
  // A one-byte tensor first puts the F32 data at an odd offset of the mapping.
  Checkpoint ckpt =
      OpenSingle({{"pad", "I8", {1}, "\x07"}, {"w", "F32", {3}, Bytes(std::vector<float>{1, 2, 3})}});
  auto w = ckpt.Load("w", {3}, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(AsF32(*w), (std::vector<float>{1, 2, 3}));
}

TEST_F(CheckpointTest, LargeTensorConvertsInParallel) {
  const int64_t n = 300 * 1000;
  std::vector<uint16_t> bits(n);
  // Integers up to 256 are exact in bf16.
  for (int64_t i = 0; i < n; ++i) bits[i] = F32ToBf16(static_cast<float>(i % 256)).bits;
  Checkpoint ckpt = OpenSingle({{"w", "BF16", {300, 1000}, Bytes(bits)}});
  auto w = ckpt.Load("w", {300, 1000}, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(w->data<float>()[i], static_cast<float>(i % 256)) << i;
}

// FP8 weights with 128x128 block scales, on shapes that are not multiples of 128 (the last block of
// each dimension is partial), small enough to convert inline and large enough to go parallel.
class Fp8Test : public CheckpointTest, public ::testing::WithParamInterface<std::pair<int64_t, int64_t>> {
 protected:
  static std::vector<uint8_t> Weight(int64_t rows, int64_t cols) {
    std::vector<uint8_t> w(rows * cols);
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = static_cast<uint8_t>(i % 251);
      if ((w[i] & 0x7f) == 0x7f) w[i] = 0;  // skip the NaN encoding
    }
    w[0] = 0x40;                             // 2.0
    w[5 * cols + 150] = 0xc0;                // -2.0
    w[(rows - 1) * cols + cols - 1] = 0x38;  // 1.0
    return w;
  }
};

TEST_P(Fp8Test, DequantizesWithBlockScales) {
  const auto [rows, cols] = GetParam();
  const int64_t srows = (rows + 127) / 128, scols = (cols + 127) / 128;
  std::vector<float> scales(srows * scols);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = std::ldexp(1.0f, static_cast<int>(i % 5) - 2);
  const std::vector<uint8_t> w = Weight(rows, cols);
  Checkpoint ckpt = OpenSingle({{"layer.weight", "F8_E4M3", {rows, cols}, Bytes(w)},
                                {"layer.weight_scale_inv", "F32", {srows, scols}, Bytes(scales)}});

  auto f32 = ckpt.Load("layer.weight", {rows, cols}, DType::kF32);
  ASSERT_TRUE(f32.ok()) << f32.status().message();
  auto b16 = ckpt.Load("layer.weight", {rows, cols}, DType::kBF16);
  ASSERT_TRUE(b16.ok()) << b16.status().message();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float expected = F8E4M3ToF32(w[r * cols + c]) * scales[(r / 128) * scols + c / 128];
      ASSERT_EQ(f32->data<float>()[r * cols + c], expected) << r << "," << c;
      ASSERT_EQ(b16->data<bf16>()[r * cols + c].bits, F32ToBf16(expected).bits) << r << "," << c;
    }
  }
  // Spot checks that do not depend on F8E4M3ToF32: scale 0.25 at [0][0], 0.5 at [0][1].
  EXPECT_EQ(f32->data<float>()[0], 0.5f);
  EXPECT_EQ(f32->data<float>()[5 * cols + 150], -1.0f);
  EXPECT_EQ(f32->data<float>()[rows * cols - 1], scales.back());
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Test,
                         ::testing::Values(std::pair<int64_t, int64_t>{130, 200},
                                           std::pair<int64_t, int64_t>{300, 260}));

TEST_F(CheckpointTest, Fp8Bf16Scales) {
  const std::vector<uint16_t> scale = {F32ToBf16(3.0f).bits};
  Checkpoint ckpt =
      OpenSingle({{"w", "F8_E4M3", {1, 2}, "\x38\x40"}, {"w_scale_inv", "BF16", {1, 1}, Bytes(scale)}});
  auto w = ckpt.Load("w", {1, 2}, DType::kF32);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(AsF32(*w), (std::vector<float>{3.0f, 6.0f}));
}

TEST_F(CheckpointTest, Fp8MissingScale) {
  Checkpoint ckpt = OpenSingle({{"w", "F8_E4M3", {1, 2}, "\x38\x40"}});
  ExpectError(ckpt.Load("w", {1, 2}, DType::kF32), {dir_.path(), "missing tensor 'w_scale_inv'", "'w'"});
}

TEST_F(CheckpointTest, Fp8BadScaleShape) {
  // [130, 200] needs [2, 2] block scales.
  Checkpoint ckpt = OpenSingle({{"w", "F8_E4M3", {130, 200}, std::string(130 * 200, '\0')},
                                {"w_scale_inv", "F32", {1, 2}, Bytes(std::vector<float>{1, 1})}});
  ExpectError(ckpt.Load("w", {130, 200}, DType::kBF16),
              {"model.safetensors", "tensor 'w_scale_inv'", "shape [1, 2], expected [2, 2]"});
}

TEST_F(CheckpointTest, Fp8BadScaleDtype) {
  Checkpoint ckpt = OpenSingle(
      {{"w", "F8_E4M3", {1, 2}, "\x38\x40"}, {"w_scale_inv", "I32", {1, 1}, Bytes(std::vector<int32_t>{1})}});
  ExpectError(ckpt.Load("w", {1, 2}, DType::kF32),
              {"model.safetensors", "tensor 'w_scale_inv'", "dtype I32"});
}

TEST_F(CheckpointTest, Fp8MustBe2D) {
  Checkpoint ckpt = OpenSingle(
      {{"w", "F8_E4M3", {2}, "\x38\x40"}, {"w_scale_inv", "F32", {1}, Bytes(std::vector<float>{1})}});
  ExpectError(ckpt.Load("w", {2}, DType::kF32), {"model.safetensors", "tensor 'w'", "must be 2-D"});
}

// A checkpoint split in two shards; the FP8 weight and its scales live in different shards.
class ShardedCheckpointTest : public CheckpointTest {
 protected:
  void WriteShards() {
    dir_.Write("model-00001-of-00002.safetensors",
               Safetensors({{"a", "F32", {2}, Bytes(std::vector<float>{1, 2})},
                            {"w", "F8_E4M3", {1, 2}, "\x38\x40"}}));
    dir_.Write("model-00002-of-00002.safetensors",
               Safetensors({{"b", "BF16", {1}, Bytes(std::vector<uint16_t>{0x4040})},
                            {"w_scale_inv", "F32", {1, 1}, Bytes(std::vector<float>{0.5f})}}));
  }
  void WriteIndex(const std::string& weight_map) {
    dir_.Write("model.safetensors.index.json",
               R"({"metadata":{"total_size":18},"weight_map":)" + weight_map + "}");
  }
  static constexpr const char* kWeightMap =
      R"({"a":"model-00001-of-00002.safetensors","w":"model-00001-of-00002.safetensors",)"
      R"("b":"model-00002-of-00002.safetensors","w_scale_inv":"model-00002-of-00002.safetensors"})";
};

TEST_F(ShardedCheckpointTest, LoadsFromEveryShard) {
  WriteShards();
  WriteIndex(kWeightMap);
  auto ckpt = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  EXPECT_EQ(ckpt->TensorNames(), (std::vector<std::string>{"a", "b", "w", "w_scale_inv"}));
  auto a = ckpt->Load("a", {2}, DType::kF32);
  auto b = ckpt->Load("b", {1}, DType::kF32);
  auto w = ckpt->Load("w", {1, 2}, DType::kF32);
  ASSERT_TRUE(a.ok() && b.ok() && w.ok());
  EXPECT_EQ(AsF32(*a), (std::vector<float>{1, 2}));
  EXPECT_EQ(AsF32(*b), (std::vector<float>{3}));
  EXPECT_EQ(AsF32(*w), (std::vector<float>{0.5f, 1.0f}));
}

TEST_F(ShardedCheckpointTest, ListedShardMissing) {
  WriteShards();
  WriteIndex(R"({"a":"model-00001-of-00002.safetensors","c":"model-00003-of-00003.safetensors"})");
  ExpectError(Checkpoint::Open(dir_.path()), {"model-00003-of-00003.safetensors", "cannot open"});
}

TEST_F(ShardedCheckpointTest, TensorNotInItsShard) {
  WriteShards();
  WriteIndex(R"({"a":"model-00002-of-00002.safetensors"})");
  ExpectError(Checkpoint::Open(dir_.path()), {"model.safetensors.index.json", "tensor 'a'",
                                              "model-00002-of-00002.safetensors", "does not contain"});
}

TEST_F(ShardedCheckpointTest, IndexWithoutWeightMap) {
  dir_.Write("model.safetensors.index.json", R"({"metadata":{}})");
  ExpectError(Checkpoint::Open(dir_.path()), {"model.safetensors.index.json", "weight_map"});
  dir_.Write("model.safetensors.index.json", R"({"weight_map":)");
  ExpectError(Checkpoint::Open(dir_.path()), {"model.safetensors.index.json", "invalid JSON"});
  WriteIndex(R"({"a":7})");
  ExpectError(Checkpoint::Open(dir_.path()), {"model.safetensors.index.json", "'a'"});
}

TEST_F(ShardedCheckpointTest, CorruptShard) {
  WriteShards();
  dir_.Write("model-00002-of-00002.safetensors",
             RawSafetensors(R"({"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "abc"));
  WriteIndex(kWeightMap);
  ExpectError(Checkpoint::Open(dir_.path()), {"model-00002-of-00002.safetensors", "tensor 'b'", "beyond"});
}

}  // namespace
}  // namespace moe
