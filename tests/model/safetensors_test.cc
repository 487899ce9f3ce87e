#include "model/safetensors.h"

#include <gtest/gtest.h>

#include "test_files.h"

namespace moe {
namespace {

using test::Bytes;
using test::ExpectError;
using test::RawSafetensors;
using test::TempDir;

constexpr const char* kFile = "weights.safetensors";

class SafetensorsTest : public ::testing::Test {
 protected:
  // Writes `bytes` as kFile and opens it.
  Expected<std::unique_ptr<SafetensorsFile>> OpenBytes(std::string_view bytes) {
    return SafetensorsFile::Open(dir_.Write(kFile, bytes));
  }
  // Opens a file whose header is `header` and whose data section is `data_size` zero bytes.
  Expected<std::unique_ptr<SafetensorsFile>> OpenHeader(std::string_view header, size_t data_size) {
    return OpenBytes(RawSafetensors(header, std::string(data_size, '\0')));
  }

  TempDir dir_;
};

TEST_F(SafetensorsTest, OpensWellFormedFile) {
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"I8","shape":[1,3],"data_offsets":[8,11]},)"
                             R"("empty":{"dtype":"BF16","shape":[0,4],"data_offsets":[11,11]}})";
  std::string data = Bytes(std::vector<float>{1.5f, -2.0f}) + "xyz";
  auto file = OpenBytes(RawSafetensors(header, data));
  ASSERT_TRUE(file.ok()) << file.status().message();

  const SafetensorsHeader& h = (*file)->header();
  EXPECT_EQ(h.metadata.at("format"), "pt");
  ASSERT_EQ(h.tensors.size(), 3u);
  const SafetensorsEntry* b = (*file)->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kI8);
  EXPECT_EQ(b->shape, (Shape{1, 3}));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*file)->Data(*b)), 3), "xyz");
  float a0;
  std::memcpy(&a0, (*file)->Data(*(*file)->Find("a")), 4);
  EXPECT_EQ(a0, 1.5f);
  EXPECT_EQ((*file)->Find("missing"), nullptr);
}

TEST_F(SafetensorsTest, EveryDtypeNameParses) {
  const std::pair<const char*, DType> cases[] = {{"F32", DType::kF32}, {"BF16", DType::kBF16},
                                                 {"F16", DType::kF16}, {"F8_E4M3", DType::kF8E4M3},
                                                 {"I8", DType::kI8},   {"I32", DType::kI32}};
  for (const auto& [name, dtype] : cases) {
    const std::string header = std::string(R"({"t":{"dtype":")") + name +
                               R"(","shape":[3],"data_offsets":[0,)" + std::to_string(3 * DTypeSize(dtype)) +
                               "]}}";
    auto parsed = ParseSafetensorsHeader(header, 12, "mem");
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    EXPECT_EQ(parsed->tensors.at("t").dtype, dtype) << name;
  }
}

TEST_F(SafetensorsTest, MissingFile) {
  ExpectError(SafetensorsFile::Open(dir_.path() + "/nope.safetensors"), {"nope.safetensors", "cannot open"});
}

TEST_F(SafetensorsTest, FileTooShortForHeaderLength) { ExpectError(OpenBytes("abc"), {kFile, "too short"}); }

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  std::string bytes = RawSafetensors("{}", "");
  bytes[0] = 100;  // claims a 100-byte header in a 10-byte file
  ExpectError(OpenBytes(bytes), {kFile, "header length 100", "beyond"});
}

TEST_F(SafetensorsTest, HugeHeaderLengthDoesNotWrap) {
  std::string bytes = RawSafetensors("{}", "");
  for (int i = 0; i < 8; ++i) bytes[i] = '\xff';
  ExpectError(OpenBytes(bytes), {kFile, "beyond"});
}

TEST_F(SafetensorsTest, InvalidJsonHeader) {
  ExpectError(OpenHeader(R"({"a": {"dtype": "F32",)", 0), {kFile, "not valid JSON"});
}

TEST_F(SafetensorsTest, HeaderNotAnObject) { ExpectError(OpenHeader("[1, 2]", 0), {kFile, "not an object"}); }

TEST_F(SafetensorsTest, EntryNotAnObject) {
  ExpectError(OpenHeader(R"({"w": 5})", 0), {kFile, "tensor 'w'", "not an object"});
}

TEST_F(SafetensorsTest, TruncatedData) {
  // The offsets promise 16 bytes; the file holds 10.
  ExpectError(OpenHeader(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 10),
              {kFile, "tensor 'w'", "beyond the data section of 10 bytes"});
}

TEST_F(SafetensorsTest, BeginAfterEnd) {
  ExpectError(OpenHeader(R"({"w":{"dtype":"I8","shape":[0],"data_offsets":[8,4]}})", 16),
              {kFile, "tensor 'w'", "begin is after end"});
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  ExpectError(OpenHeader(R"({"w":{"dtype":"I8","shape":[4],"data_offsets":[100,104]}})", 16),
              {kFile, "tensor 'w'", "[100, 104]", "beyond"});
}

TEST_F(SafetensorsTest, OffsetsNotAPair) {
  for (const char* offsets : {"[0]", "[0,4,8]", R"(["0",4])", "[-1,3]", "[0.5,4]", "7"}) {
    const std::string header =
        std::string(R"({"w":{"dtype":"I8","shape":[4],"data_offsets":)") + offsets + "}}";
    ExpectError(OpenHeader(header, 16), {kFile, "tensor 'w'", "data_offsets"});
  }
}

TEST_F(SafetensorsTest, ByteSizeMismatch) {
  ExpectError(OpenHeader(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16),
              {kFile, "tensor 'w'", "hold 12 bytes", "needs 16"});
}

TEST_F(SafetensorsTest, ShapeOverflowDoesNotWrap) {
  // 2^62 * 2^62 * 4 bytes wraps to 0 in 64-bit arithmetic; it must not match an empty range.
  ExpectError(OpenHeader(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],)"
                         R"("data_offsets":[0,0]}})",
                         0),
              {kFile, "tensor 'w'", "more than 2^64"});
}

TEST_F(SafetensorsTest, OverlappingOffsets) {
  ExpectError(OpenHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         16),
              {kFile, "tensor 'b'", "overlap tensor 'a'"});
}

TEST_F(SafetensorsTest, EmptyTensorsMayShareAnOffset) {
  auto file = OpenHeader(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                         8);
  EXPECT_TRUE(file.ok()) << file.status().message();
}

TEST_F(SafetensorsTest, UnknownDtype) {
  ExpectError(OpenHeader(R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,1]}})", 1),
              {kFile, "tensor 'w'", "unknown dtype 'Q4_K'"});
}

TEST_F(SafetensorsTest, UnsupportedDtype) {
  for (const char* dtype : {"F64", "I64", "BOOL"}) {
    const std::string header =
        std::string(R"({"w":{"dtype":")") + dtype + R"(","shape":[1],"data_offsets":[0,8]}})";
    ExpectError(OpenHeader(header, 8),
                {kFile, "tensor 'w'", std::string("unsupported dtype '") + dtype + "'"});
  }
}

TEST_F(SafetensorsTest, DtypeNotAString) {
  ExpectError(OpenHeader(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4),
              {kFile, "tensor 'w'", "'dtype' must be a string"});
}

TEST_F(SafetensorsTest, BadShape) {
  for (const char* shape : {"[-1]", "[2.5]", R"(["2"])", "[[2]]", "3", "null"}) {
    const std::string header =
        std::string(R"({"w":{"dtype":"I8","shape":)") + shape + R"(,"data_offsets":[0,2]}})";
    ExpectError(OpenHeader(header, 2),
                {kFile, "tensor 'w'", "'shape' must be a list of non-negative integers"});
  }
}

TEST_F(SafetensorsTest, MetadataMustMapStringsToStrings) {
  ExpectError(OpenHeader(R"({"__metadata__":{"format":1}})", 0), {kFile, "__metadata__", "format"});
  ExpectError(OpenHeader(R"({"__metadata__":[]})", 0), {kFile, "__metadata__"});
}

TEST_F(SafetensorsTest, HeaderParsesWithoutAFile) {
  auto header =
      ParseSafetensorsHeader(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[2,8]}})", 8, "mem");
  ASSERT_TRUE(header.ok()) << header.status().message();
  EXPECT_EQ(header->tensors.at("w").begin, 2u);
  EXPECT_EQ(header->tensors.at("w").end, 8u);
  ExpectError(ParseSafetensorsHeader("", 0, "mem"), {"mem", "not valid JSON"});
  ExpectError(ParseSafetensorsHeader(R"({"n": 1e999})", 0, "mem"), {"mem", "not valid JSON"});
}

}  // namespace
}  // namespace moe
