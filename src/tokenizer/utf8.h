// UTF-8 scanning shared by the pre-tokenizer and the incremental detokenizer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace moe::utf8 {

enum class Kind {
  kValid,       // a whole, well-formed character
  kInvalid,     // an ill-formed sequence that no further byte can repair
  kIncomplete,  // a well-formed prefix cut short by the end of the input
};

struct Sequence {
  Kind kind;
  // kValid: the character's length. kInvalid: the length of the maximal ill-formed subpart (at
  // least 1), the unit that Unicode's "substitution of maximal subparts" replaces with one U+FFFD.
  // kIncomplete: the bytes left in the input.
  size_t length;
};

// Classifies the sequence starting at `pos` (< s.size()) per Unicode's table of well-formed UTF-8
// byte sequences (no overlongs, no surrogates, nothing above U+10FFFF).
Sequence Scan(std::string_view s, size_t pos);

// `s` with every ill-formed or truncated sequence replaced by U+FFFD.
std::string Sanitize(std::string_view s);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace moe::utf8
