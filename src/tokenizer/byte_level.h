// The GPT-2 byte-level alphabet: every byte maps to one printable Unicode character, so BPE
// vocabularies can be stored as JSON strings while covering arbitrary bytes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moe {

class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();

  // The UTF-8 encoding of the character that stands for `byte`.
  const std::string& Char(uint8_t byte) const { return chars_[byte]; }

  // The byte-level spelling of raw bytes.
  std::string Encode(std::string_view bytes) const;

  // The raw bytes a token string spells, or nullopt when one of its characters is outside the
  // alphabet (e.g. added tokens like "<｜User｜>", which stand for their own text).
  std::optional<std::string> Decode(std::string_view token) const;

 private:
  std::array<std::string, 256> chars_;
  // Code point -> byte + 1, 0 where the code point is not in the alphabet. The alphabet's code
  // points are all below 324.
  std::array<uint16_t, 324> bytes_{};
};

// Appends the UTF-8 encoding of `code_point` (a valid scalar value).
void AppendUtf8(uint32_t code_point, std::string& out);

}  // namespace moe
