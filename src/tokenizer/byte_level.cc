#include "tokenizer/byte_level.h"

#include "base/check.h"

namespace moe {

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  // GPT-2's rule: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the
  // others (controls, space, soft hyphen, ...) take code points 256, 257, ... in byte order.
  const auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
    MOE_CHECK(cp < bytes_.size(), "byte-level code point %u out of range", cp);
    AppendUtf8(cp, chars_[b]);
    bytes_[cp] = static_cast<uint16_t>(b + 1);
  }
}

std::string ByteLevelAlphabet::Encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += chars_[static_cast<uint8_t>(c)];
  return out;
}

std::optional<std::string> ByteLevelAlphabet::Decode(std::string_view token) const {
  std::string out;
  // The alphabet's characters take one or two UTF-8 bytes; anything longer is not in it.
  for (size_t i = 0; i < token.size();) {
    const auto b0 = static_cast<uint8_t>(token[i]);
    uint32_t cp;
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < token.size() &&
               (static_cast<uint8_t>(token[i + 1]) & 0xC0) == 0x80) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(token[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;
    }
    if (cp >= bytes_.size() || bytes_[cp] == 0) return std::nullopt;
    out += static_cast<char>(bytes_[cp] - 1);
  }
  return out;
}

}  // namespace moe
