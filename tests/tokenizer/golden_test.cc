// Compares Tokenizer with an independent implementation (transformers.js) on DeepSeek-V3's real
// tokenizer. The files and goldens come from tools/tokenizer-goldens, written into the build tree
// by the tokenizer_goldens_setup test (make_goldens.sh).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace moe {
namespace {

using nlohmann::json;

constexpr const char* kGoldenDir = MOE_TOKENIZER_GOLDEN_DIR;
constexpr size_t kMaxReported = 5;

std::vector<json> ReadJsonLines(const std::string& path) {
  std::ifstream file(path);
  std::vector<json> lines;
  for (std::string line; std::getline(file, line);) {
    if (!line.empty()) lines.push_back(json::parse(line));
  }
  return lines;
}

class GoldenTest : public testing::Test {
 protected:
  void SetUp() override {
    auto loaded = Tokenizer::Load(kGoldenDir);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message()
                             << "\n(the goldens come from the tokenizer_goldens_setup test: run "
                                "ctest -L tokenizer, or tests/tokenizer/make_goldens.sh "
                             << kGoldenDir << ")";
    tokenizer_.emplace(std::move(loaded).value());
  }

  // One id per token with the text it stands for, to show where two tokenizations part.
  std::string Describe(const std::vector<int32_t>& ids) const {
    std::string out;
    for (int32_t id : ids) {
      auto text = tokenizer_->Decode(std::span(&id, 1));
      out += std::to_string(id) + ":" +
             (text.ok() ? json(*text).dump(-1, ' ', false, json::error_handler_t::replace)
                        : "<" + text.status().message() + ">") +
             " ";
    }
    return out;
  }

  std::optional<Tokenizer> tokenizer_;
};

TEST_F(GoldenTest, EncodeMatchesTransformersJsAndRoundTrips) {
  const std::vector<json> goldens = ReadJsonLines(std::string(kGoldenDir) + "/goldens.jsonl");
  ASSERT_GE(goldens.size(), 2000u) << "too few golden strings in " << kGoldenDir;

  size_t id_mismatches = 0, round_trip_failures = 0;
  for (const json& golden : goldens) {
    const std::string text = golden["text"].get<std::string>();
    const auto expected = golden["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> actual = tokenizer_->Encode(text, /*add_bos=*/false);
    if (actual != expected && ++id_mismatches <= kMaxReported) {
      ADD_FAILURE() << "ids differ for " << golden["text"].dump() << "\n  expected "
                    << Describe(expected) << "\n  actual   " << Describe(actual);
    }
    const auto decoded = tokenizer_->Decode(actual);
    if ((!decoded.ok() || *decoded != text) && ++round_trip_failures <= kMaxReported) {
      ADD_FAILURE() << "decode(encode(s)) != s for " << golden["text"].dump() << ": got "
                    << (decoded.ok()
                            ? json(*decoded).dump(-1, ' ', false, json::error_handler_t::replace)
                            : decoded.status().message());
    }
  }
  EXPECT_EQ(id_mismatches, 0u) << "of " << goldens.size() << " strings";
  EXPECT_EQ(round_trip_failures, 0u) << "of " << goldens.size() << " strings";
}

TEST_F(GoldenTest, ChatTemplateMatchesJinjaRendering) {
  const std::vector<json> goldens = ReadJsonLines(std::string(kGoldenDir) + "/chat_goldens.jsonl");
  ASSERT_GE(goldens.size(), 100u) << "too few conversations in " << kGoldenDir;

  size_t failures = 0;
  for (const json& golden : goldens) {
    std::vector<ChatMessage> messages;
    for (const json& message : golden["messages"]) {
      messages.push_back(
          {message["role"].get<std::string>(), message["content"].get<std::string>()});
    }
    const auto text =
        tokenizer_->ApplyChatTemplate(messages, golden["add_generation_prompt"].get<bool>());
    ASSERT_TRUE(text.ok()) << text.status().message();
    const auto expected_ids = golden["ids"].get<std::vector<int32_t>>();
    if ((*text != golden["text"].get<std::string>() ||
         tokenizer_->Encode(*text, false) != expected_ids) &&
        ++failures <= kMaxReported) {
      ADD_FAILURE() << "conversation " << golden["messages"].dump() << "\n  expected "
                    << golden["text"].dump() << "\n  actual   " << json(*text).dump();
    }
  }
  EXPECT_EQ(failures, 0u) << "of " << goldens.size() << " conversations";
}

TEST_F(GoldenTest, DeepSeekV3Specials) {
  EXPECT_EQ(tokenizer_->bos_id(), 0);
  EXPECT_EQ(tokenizer_->eos_id(), 1);
  EXPECT_EQ(tokenizer_->vocab_size(), 128815);
  EXPECT_TRUE(tokenizer_->add_bos_token());
  EXPECT_NE(tokenizer_->chat_template().find("<｜User｜>"), std::string::npos);
  EXPECT_EQ(tokenizer_->Encode("Hello", true), (std::vector<int32_t>{0, 19923}));
}

}  // namespace
}  // namespace moe
