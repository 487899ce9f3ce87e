#include "tokenizer/added_tokens.h"

#include "base/check.h"

namespace moe {
namespace {

uint64_t EdgeKey(int32_t node, char byte) {
  return (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(byte);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher() : node_ids_{-1} {}

void AddedTokenMatcher::Add(std::string_view content, int32_t id) {
  MOE_CHECK(!content.empty(), "empty added token");
  first_bytes_.set(static_cast<uint8_t>(content[0]));
  int32_t node = 0;
  for (char byte : content) {
    const auto [it, inserted] =
        edges_.try_emplace(EdgeKey(node, byte), static_cast<int32_t>(node_ids_.size()));
    if (inserted) node_ids_.push_back(-1);
    node = it->second;
  }
  node_ids_[node] = id;
}

std::optional<AddedTokenMatcher::Match> AddedTokenMatcher::FindNext(std::string_view text,
                                                                    size_t from) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (!first_bytes_.test(static_cast<uint8_t>(text[pos]))) continue;
    std::optional<Match> longest;
    int32_t node = 0;
    for (size_t end = pos; end < text.size(); ++end) {
      const auto it = edges_.find(EdgeKey(node, text[end]));
      if (it == edges_.end()) break;
      node = it->second;
      if (node_ids_[node] >= 0) longest = Match{pos, end + 1 - pos, node_ids_[node]};
    }
    if (longest) return longest;
  }
  return std::nullopt;
}

}  // namespace moe
