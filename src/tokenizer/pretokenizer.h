// Pre-tokenization: cuts text into the pieces that BPE encodes independently, following the
// "pre_tokenizer" section of a Hugging Face tokenizer.json.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string_view>
#include <vector>

#include "base/status.h"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace moe {

// A PCRE2 pattern that splits text the way the `Split` pre-tokenizer does with behavior
// "Isolated": every match is a piece and so is every stretch between matches.
//
// Invalid UTF-8 rule: patterns are compiled with PCRE2_MATCH_INVALID_UTF, under which ill-formed
// bytes never match anything. They therefore end up in the stretches between matches, as pieces
// of their own or glued to neighbouring unmatched text, and BPE spells them with byte-level
// tokens like any other byte. Encoding never fails and decoding gives the original bytes back.
class SplitRegex {
 public:
  // `literal`: the pattern is a plain string (tokenizer.json's {"String": ...}), not a regex.
  static Expected<SplitRegex> Compile(std::string_view pattern, bool literal);

  // Appends the pieces of `text` to `out`. `match_data` is scratch space with at least one pair.
  void Split(std::string_view text, pcre2_real_match_data_8* match_data,
             std::vector<std::string_view>& out) const;

 private:
  struct CodeDeleter {
    void operator()(pcre2_real_code_8* code) const;
  };
  std::unique_ptr<pcre2_real_code_8, CodeDeleter> code_;
};

class PreTokenizer {
 public:
  // `config` is the "pre_tokenizer" value. Accepts a ByteLevel pre-tokenizer, alone or as the last
  // step of a Sequence whose other steps are Split (behavior "Isolated", invert false).
  static Expected<PreTokenizer> FromJson(const nlohmann::json& config);

  // The pieces of `text`, as views into it, in order; together they cover all of it.
  std::vector<std::string_view> Split(std::string_view text) const;

 private:
  std::vector<SplitRegex> steps_;
};

}  // namespace moe
