#include "tokenizer/utf8.h"

#include <cstdint>

namespace moe::utf8 {

Sequence Scan(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) return {Kind::kValid, 1};

  // The number of continuation bytes and the allowed range of the first one; the lead bytes that
  // would start overlongs, surrogates or code points above U+10FFFF narrow that range.
  size_t continuations;
  uint8_t first_lo = 0x80, first_hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    continuations = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    continuations = 2;
    if (lead == 0xE0) first_lo = 0xA0;
    if (lead == 0xED) first_hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    continuations = 3;
    if (lead == 0xF0) first_lo = 0x90;
    if (lead == 0xF4) first_hi = 0x8F;
  } else {
    return {Kind::kInvalid, 1};
  }

  for (size_t i = 1; i <= continuations; ++i) {
    if (pos + i >= s.size()) return {Kind::kIncomplete, s.size() - pos};
    const uint8_t lo = i == 1 ? first_lo : 0x80;
    const uint8_t hi = i == 1 ? first_hi : 0xBF;
    if (byte(pos + i) < lo || byte(pos + i) > hi) return {Kind::kInvalid, i};
  }
  return {Kind::kValid, continuations + 1};
}

std::string Sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const Sequence seq = Scan(s, pos);
    if (seq.kind == Kind::kValid) {
      out.append(s.substr(pos, seq.length));
    } else {
      out.append(kReplacementChar);
    }
    pos += seq.length;
  }
  return out;
}

}  // namespace moe::utf8
