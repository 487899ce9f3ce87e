// Finds added tokens (special tokens like "<｜User｜>") in raw text before pre-tokenization.
#pragma once

#include <bitset>
#include <cstdint>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moe {

class AddedTokenMatcher {
 public:
  AddedTokenMatcher();

  // `content` must not be empty. A later Add of the same content replaces the id.
  void Add(std::string_view content, int32_t id);

  struct Match {
    size_t pos;
    size_t length;
    int32_t id;
  };
  // The leftmost occurrence of any added token at or after `from`; the longest one there.
  std::optional<Match> FindNext(std::string_view text, size_t from) const;

 private:
  // A byte trie: node 0 is the root.
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  std::vector<int32_t> node_ids_;                // token id ending at a node, or -1
  std::bitset<256> first_bytes_;                 // lets the scan skip most positions cheaply
};

}  // namespace moe
