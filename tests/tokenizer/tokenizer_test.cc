// Tokenizer tests on a tiny hand-written tokenizer.json: byte-level vocab, a few merges and
// DeepSeek-V3's special tokens and pre-tokenizer.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace moe {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// GPT-2's byte -> character map, written out independently of the code under test.
std::string ByteChar(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int other = 0; other < b; ++other) {
      const bool p =
          (other >= '!' && other <= '~') || (other >= 0xA1 && other <= 0xAC) || other >= 0xAE;
      if (!p) ++cp;
    }
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// DeepSeek-V3's pre_tokenizer section, as in its tokenizer.json.
json DeepSeekPreTokenizer() {
  const auto split = [](const std::string& regex) {
    return json{{"type", "Split"},
                {"pattern", {{"Regex", regex}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  };
  return {{"type", "Sequence"},
          {"pretokenizers",
           {split(R"(\p{N}{1,3})"),
            split("[一-龥぀-ゟ゠-ヿ]+"),
            split(R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^)"
                  "\r\n"
                  R"(\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[)"
                  "\r\n"
                  R"(]*|\s*[)"
                  "\r\n"
                  R"(]+|\s+(?!\S)|\s+)"),
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}}}};
}

// Ids: byte b is id b; merged tokens 256..263; added tokens 300..305.
enum : int32_t {
  kLl = 256,
  kEl,
  kHe,
  kLlo,
  kHello,
  kAa,
  kSpaceW,
  k34,
  kBos = 300,
  kEos,
  kUser,
  kAssistant,
  kA,
  kAB,
};

json TinyTokenizerJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"l", "l"},    {"e", "l"}, {"h", "e"}, {"ll", "o"},
      {"he", "llo"}, {"a", "a"}, {"Ġ", "w"}, {"3", "4"}};
  json merge_list = json::array();
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [left, right] = merges[i];
    vocab[left + right] = static_cast<int32_t>(256 + i);
    // Both spellings Hugging Face writes: "a b" (older) and ["a", "b"] (newer).
    merge_list.push_back(i % 2 ? json(left + " " + right) : json::array({left, right}));
  }
  const auto added = [](int32_t id, const std::string& content, bool special) {
    return json{{"id", id},          {"content", content}, {"single_word", false},
                {"lstrip", false},   {"rstrip", false},    {"normalized", !special},
                {"special", special}};
  };
  return {
      {"version", "1.0"},
      {"added_tokens",
       {added(kBos, "<｜begin▁of▁sentence｜>", true), added(kEos, "<｜end▁of▁sentence｜>", true),
        added(kUser, "<｜User｜>", false), added(kAssistant, "<｜Assistant｜>", false),
        added(kA, "[A]", true), added(kAB, "[A][B]", true)}},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array()}}},
      {"pre_tokenizer", DeepSeekPreTokenizer()},
      {"post_processor",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", false},
        {"use_regex", true}}},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
}

json TinyConfigJson() {
  return {{"add_bos_token", true},
          {"bos_token", {{"__type", "AddedToken"}, {"content", "<｜begin▁of▁sentence｜>"}}},
          {"eos_token", "<｜end▁of▁sentence｜>"},
          {"chat_template",
           "{{bos_token}}{% for m in messages %}{{'<｜User｜>' + m['content']}}"
           "{{'<｜Assistant｜>'}}{% endfor %}"}};
}

class TokenizerTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "moe_tokenizer_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& name, const std::string& content) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << content;
  }
  void WriteFiles(const json& tokenizer, const json& config) {
    Write("tokenizer.json", tokenizer.dump(2));
    Write("tokenizer_config.json", config.dump(2));
  }
  Tokenizer LoadTiny() {
    WriteFiles(TinyTokenizerJson(), TinyConfigJson());
    auto tokenizer = Tokenizer::Load(dir_);
    MOE_CHECK(tokenizer.ok(), "%s", tokenizer.status().message().c_str());
    return std::move(tokenizer).value();
  }
  // Loading fails with a message that holds every one of `parts`.
  void ExpectLoadError(const std::vector<std::string>& parts) {
    const auto tokenizer = Tokenizer::Load(dir_);
    ASSERT_FALSE(tokenizer.ok());
    for (const std::string& part : parts) {
      EXPECT_NE(tokenizer.status().message().find(part), std::string::npos)
          << "'" << part << "' not in: " << tokenizer.status().message();
    }
  }

  std::string dir_;
};

Ids Bytes(std::string_view text) {
  Ids ids;
  for (char c : text) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST_F(TokenizerTest, LoadsSpecialsAndConfig) {
  const Tokenizer tokenizer = LoadTiny();
  EXPECT_EQ(tokenizer.bos_id(), kBos);
  EXPECT_EQ(tokenizer.eos_id(), kEos);
  EXPECT_EQ(tokenizer.vocab_size(), kAB + 1);
  EXPECT_TRUE(tokenizer.add_bos_token());
  EXPECT_EQ(tokenizer.chat_template(), TinyConfigJson()["chat_template"].get<std::string>());
}

TEST_F(TokenizerTest, MergesApplyInRankOrder) {
  const Tokenizer tokenizer = LoadTiny();
  // "e l" outranks "h e", so "hel" is h + el, not he + l.
  EXPECT_EQ(tokenizer.Encode("hel", false), (Ids{'h', kEl}));
  // l l -> ll, then h e (e l no longer applies), ll o, he llo.
  EXPECT_EQ(tokenizer.Encode("hello", false), (Ids{kHello}));
  // Equal ranks merge leftmost first.
  EXPECT_EQ(tokenizer.Encode("aaa", false), (Ids{kAa, 'a'}));
  EXPECT_EQ(tokenizer.Encode("aaaa", false), (Ids{kAa, kAa}));
  // Repeats come from the cache and must not differ.
  EXPECT_EQ(tokenizer.Encode("hel hel", false), (Ids{'h', kEl, ' ', 'h', kEl}));
}

TEST_F(TokenizerTest, PreTokenizerBoundsMerges) {
  const Tokenizer tokenizer = LoadTiny();
  // The space joins the following word's piece: Ġw merges.
  EXPECT_EQ(tokenizer.Encode(" world", false), (Ids{kSpaceW, 'o', 'r', 'l', 'd'}));
  // Digits split in threes: "3 4" merges inside "345" but not across "123|45".
  EXPECT_EQ(tokenizer.Encode("345", false), (Ids{k34, '5'}));
  EXPECT_EQ(tokenizer.Encode("12345", false), (Ids{'1', '2', '3', '4', '5'}));
  // Chinese runs are their own pieces; "a" and "a" around one stay apart.
  EXPECT_EQ(tokenizer.Encode("a中a", false), Bytes("a中a"));
  EXPECT_EQ(tokenizer.Encode("", false), Ids{});
}

TEST_F(TokenizerTest, AddedTokensMatchFirstAndLongest) {
  const Tokenizer tokenizer = LoadTiny();
  EXPECT_EQ(tokenizer.Encode("x[A][B]y[A]z", false), (Ids{'x', kAB, 'y', kA, 'z'}));
  EXPECT_EQ(tokenizer.Encode("<｜User｜>hello<｜Assistant｜>", false),
            (Ids{kUser, kHello, kAssistant}));
  // Added tokens cut pieces: "hel" + "lo" do not merge across one.
  EXPECT_EQ(tokenizer.Encode("hel[A]lo", false), (Ids{'h', kEl, kA, 'l', 'o'}));
  // Incomplete specials are plain text.
  EXPECT_EQ(tokenizer.Encode("<｜User", false), Bytes("<｜User"));
  EXPECT_EQ(tokenizer.Encode("hello", true), (Ids{kBos, kHello}));
}

TEST_F(TokenizerTest, InvalidUtf8IsEncodedAsBytesAndRoundTrips) {
  const Tokenizer tokenizer = LoadTiny();
  const std::string inputs[] = {
      "\xFF",
      "ab\xFE\xFFhello",
      "\xE4\xBD",                        // a truncated 你
      "\xE4\xBDhello\xE4\xBD\xA0",       // truncated, then a whole 你
      "\x80\x80 \xC0\xAF \xED\xA0\x80",  // stray continuations, an overlong, a surrogate
      "\xF4\x90\x80\x80<｜User｜>\xF0",  // above U+10FFFF, a special, a lone lead byte
      std::string("a\0b", 3),
  };
  for (const std::string& input : inputs) {
    const Ids ids = tokenizer.Encode(input, false);
    const auto decoded = tokenizer.Decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status().message();
    EXPECT_EQ(*decoded, input);
  }
  EXPECT_EQ(tokenizer.Encode("\xFF", false), (Ids{0xFF}));
  EXPECT_EQ(tokenizer.Encode("\xFFhello", false), (Ids{0xFF, kHello}));
}

TEST_F(TokenizerTest, DecodeNamesUnknownIds) {
  const Tokenizer tokenizer = LoadTiny();
  for (int32_t bad : {5000, -1, 299}) {
    const Ids ids = {'a', bad};
    const auto text = tokenizer.Decode(ids);
    ASSERT_FALSE(text.ok());
    EXPECT_NE(text.status().message().find(std::to_string(bad)), std::string::npos)
        << text.status().message();
  }
  const Ids ids = {kBos, kUser, kHello, kSpaceW, kEos};
  EXPECT_EQ(*tokenizer.Decode(ids),
            "<｜begin▁of▁sentence｜><｜User｜>hello w<｜end▁of▁sentence｜>");
}

TEST_F(TokenizerTest, ConcurrentEncodesAgree) {
  const Tokenizer tokenizer = LoadTiny();
  const std::string text = "hello world 12345 你好 aaaa hel <｜User｜>";
  const Ids expected = tokenizer.Encode(text, false);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) mismatches[t] += tokenizer.Encode(text, false) != expected;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// Pushes each id and returns the pieces the detokenizer emits, then the flushed rest.
std::vector<std::string> Stream(const Tokenizer& tokenizer, const Ids& ids) {
  IncrementalDetokenizer detokenizer(tokenizer);
  std::vector<std::string> pieces;
  for (int32_t id : ids) {
    auto piece = detokenizer.Push(id);
    MOE_CHECK(piece.ok(), "%s", piece.status().message().c_str());
    pieces.push_back(*piece);
  }
  pieces.push_back(detokenizer.Flush());
  return pieces;
}

TEST_F(TokenizerTest, DetokenizerHoldsSplitCharacters) {
  const Tokenizer tokenizer = LoadTiny();
  // Without merges for them, every byte of 你好 and 😀 is its own token.
  EXPECT_EQ(Stream(tokenizer, Bytes("你好")),
            (std::vector<std::string>{"", "", "你", "", "", "好", ""}));
  EXPECT_EQ(Stream(tokenizer, Bytes("😀!")), (std::vector<std::string>{"", "", "", "😀", "!", ""}));
  EXPECT_EQ(Stream(tokenizer, {kHello, 0xE4, 0xBD, kUser}),
            (std::vector<std::string>{"hello", "", "", "\uFFFD<｜User｜>", ""}));
}

TEST_F(TokenizerTest, DetokenizerReplacesInvalidBytes) {
  const Tokenizer tokenizer = LoadTiny();
  // 0xFF can never start a character: replaced at once rather than held.
  EXPECT_EQ(Stream(tokenizer, {0xFF, 'a'}), (std::vector<std::string>{"\uFFFD", "a", ""}));
  // A truncated character at the end of the stream comes out of Flush.
  EXPECT_EQ(Stream(tokenizer, {'a', 0xF0, 0x9F}),
            (std::vector<std::string>{"a", "", "", "\uFFFD"}));

  IncrementalDetokenizer detokenizer(tokenizer);
  const auto bad = detokenizer.Push(4242);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("4242"), std::string::npos);
}

TEST_F(TokenizerTest, ChatTemplate) {
  const Tokenizer tokenizer = LoadTiny();
  const std::vector<ChatMessage> messages = {{"system", "Be brief."},
                                             {"user", "Hi"},
                                             {"assistant", "Hello!"},
                                             {"system", "Be kind."},
                                             {"user", "2+2?"}};
  EXPECT_EQ(*tokenizer.ApplyChatTemplate(messages, true),
            "<｜begin▁of▁sentence｜>Be brief.\n\nBe kind.<｜User｜>Hi<｜Assistant｜>Hello!"
            "<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜>");
  EXPECT_EQ(*tokenizer.ApplyChatTemplate({{"user", "Hi"}}, false),
            "<｜begin▁of▁sentence｜><｜User｜>Hi");
  EXPECT_EQ(*tokenizer.ApplyChatTemplate({}, true), "<｜begin▁of▁sentence｜><｜Assistant｜>");
  EXPECT_EQ(tokenizer.Encode(*tokenizer.ApplyChatTemplate({{"user", "hello"}}, true), false),
            (Ids{kBos, kUser, kHello, kAssistant}));

  const auto tool = tokenizer.ApplyChatTemplate({{"tool", "42"}}, true);
  ASSERT_FALSE(tool.ok());
  EXPECT_NE(tool.status().message().find("'tool'"), std::string::npos);
}

TEST_F(TokenizerTest, ChatTemplateNeedsDeepSeekTokensAndTemplate) {
  json tokenizer_json = TinyTokenizerJson();
  tokenizer_json["added_tokens"].erase(2);  // <｜User｜>
  WriteFiles(tokenizer_json, TinyConfigJson());
  auto tokenizer = Tokenizer::Load(dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  auto prompt = tokenizer->ApplyChatTemplate({{"user", "Hi"}}, true);
  ASSERT_FALSE(prompt.ok());
  EXPECT_NE(prompt.status().message().find("<｜User｜>"), std::string::npos);

  json config = TinyConfigJson();
  config["chat_template"] = "{% for m in messages %}<|im_start|>{{m['content']}}{% endfor %}";
  WriteFiles(TinyTokenizerJson(), config);
  tokenizer = Tokenizer::Load(dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  prompt = tokenizer->ApplyChatTemplate({{"user", "Hi"}}, true);
  ASSERT_FALSE(prompt.ok());
  EXPECT_NE(prompt.status().message().find("tokenizer_config.json"), std::string::npos);
}

TEST_F(TokenizerTest, Gpt2ByteLevelPreTokenizer) {
  json tokenizer_json = TinyTokenizerJson();
  tokenizer_json["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  json config = TinyConfigJson();
  config.erase("bos_token");
  config["add_bos_token"] = false;
  WriteFiles(tokenizer_json, config);
  const auto tokenizer = Tokenizer::Load(dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  EXPECT_EQ(tokenizer->bos_id(), std::nullopt);
  EXPECT_FALSE(tokenizer->add_bos_token());
  // GPT-2 keeps digit runs whole ("3 4" merges in "12345") and splits off "'ll".
  EXPECT_EQ(tokenizer->Encode("12345", true), (Ids{'1', '2', k34, '5'}));
  EXPECT_EQ(tokenizer->Encode("hello world'll", false),
            (Ids{kHello, kSpaceW, 'o', 'r', 'l', 'd', '\'', kLl}));
}

TEST_F(TokenizerTest, SplitPatternsThatMatchEmpty) {
  // "l*" matches empty before every other character; only real matches cut.
  json tokenizer_json = TinyTokenizerJson();
  tokenizer_json["pre_tokenizer"]["pretokenizers"] = {
      {{"type", "Split"}, {"pattern", {{"Regex", "l*"}}}, {"behavior", "Isolated"}},
      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}};
  WriteFiles(tokenizer_json, TinyConfigJson());
  auto tokenizer = Tokenizer::Load(dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  // Cut as "he" + "l", so "e l" cannot merge.
  EXPECT_EQ(tokenizer->Encode("hel", false), (Ids{kHe, 'l'}));
  EXPECT_EQ(tokenizer->Encode("h\xFF"
                              "e",
                              false),
            (Ids{'h', 0xFF, 'e'}));

  // "l*$" matches empty only at the very end.
  tokenizer_json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "l*$";
  WriteFiles(tokenizer_json, TinyConfigJson());
  tokenizer = Tokenizer::Load(dir_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  EXPECT_EQ(tokenizer->Encode("he", false), (Ids{kHe}));
  EXPECT_EQ(tokenizer->Encode("hell", false), (Ids{kHe, kLl}));
}

TEST_F(TokenizerTest, MissingFilesNameThePath) {
  ExpectLoadError({dir_ + "/tokenizer.json", "cannot open"});
  Write("tokenizer.json", TinyTokenizerJson().dump());
  ExpectLoadError({dir_ + "/tokenizer_config.json", "cannot open"});
}

TEST_F(TokenizerTest, InvalidJsonNamesTheFile) {
  Write("tokenizer.json", "{\"model\": ");
  Write("tokenizer_config.json", "{}");
  ExpectLoadError({dir_ + "/tokenizer.json", "invalid JSON"});
  Write("tokenizer.json", TinyTokenizerJson().dump());
  Write("tokenizer_config.json", "not json");
  ExpectLoadError({dir_ + "/tokenizer_config.json", "invalid JSON"});
}

TEST_F(TokenizerTest, UnsupportedComponentsAreNamed) {
  const std::string path = dir_ + "/tokenizer.json";
  struct Case {
    std::string pointer;  // JSON pointer of the section to replace
    json value;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"/pre_tokenizer", {{"type", "Whitespace"}}, "'Whitespace'"},
      {"/pre_tokenizer/pretokenizers/1", {{"type", "Digits"}}, "'Digits'"},
      {"/pre_tokenizer/pretokenizers/0/behavior", "Removed", "Removed"},
      {"/pre_tokenizer/pretokenizers/0/pattern", {{"Regex", "(unclosed"}}, "(unclosed"},
      {"/pre_tokenizer/pretokenizers/3/add_prefix_space", true, "add_prefix_space"},
      {"/pre_tokenizer", nullptr, "byte-level"},
      {"/normalizer", {{"type", "NFC"}}, "'NFC'"},
      {"/decoder", {{"type", "Metaspace"}}, "'Metaspace'"},
      {"/post_processor", {{"type", "TemplateProcessing"}}, "'TemplateProcessing'"},
      {"/model/type", "WordPiece", "WordPiece"},
      {"/model/byte_fallback", true, "byte_fallback"},
      {"/model/merges/0", "l q", "'lq'"},
      {"/model/merges/1", "e", "merges[1]"},
      {"/model/vocab/a", "x", "'a'"},
      {"/added_tokens/0/lstrip", true, "lstrip"},
  };
  for (const Case& c : cases) {
    json tokenizer_json = TinyTokenizerJson();
    tokenizer_json[json::json_pointer(c.pointer)] = c.value;
    WriteFiles(tokenizer_json, TinyConfigJson());
    SCOPED_TRACE(c.pointer);
    ExpectLoadError({path, c.expected});
  }

  // A vocab without every byte is not byte-level.
  json tokenizer_json = TinyTokenizerJson();
  tokenizer_json["model"]["vocab"].erase(ByteChar(0));
  WriteFiles(tokenizer_json, TinyConfigJson());
  ExpectLoadError({path, "byte 0x00"});
}

TEST_F(TokenizerTest, BadConfigIsNamed) {
  const std::string path = dir_ + "/tokenizer_config.json";
  json config = TinyConfigJson();
  config["bos_token"] = "<s>";
  WriteFiles(TinyTokenizerJson(), config);
  ExpectLoadError({path, "'<s>'"});

  config = TinyConfigJson();
  config["add_bos_token"] = "yes";
  WriteFiles(TinyTokenizerJson(), config);
  ExpectLoadError({path, "add_bos_token"});
}

}  // namespace
}  // namespace moe
