#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace moe {

Expected<std::string> IncrementalDetokenizer::Push(int32_t id) {
  MOE_ASSIGN_OR_RETURN(const std::string bytes, tokenizer_.Decode(std::span(&id, 1)));
  pending_ += bytes;
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const utf8::Sequence seq = utf8::Scan(pending_, pos);
    if (seq.kind == utf8::Kind::kIncomplete) break;
    if (seq.kind == utf8::Kind::kValid) {
      out.append(pending_, pos, seq.length);
    } else {
      out.append(utf8::kReplacementChar);
    }
    pos += seq.length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out = utf8::Sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace moe
