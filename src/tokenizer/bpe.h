// Byte-level BPE: the "model" section of a Hugging Face tokenizer.json.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tokenizer/byte_level.h"

namespace moe {

class BpeModel {
 public:
  // `model` is the "model" section: type BPE, vocab (byte-level token -> id) and merges, either
  // "a b" strings or ["a", "b"] pairs, in priority order.
  static Expected<BpeModel> FromJson(const nlohmann::json& model);

  BpeModel();  // empty: encodes nothing useful until replaced by one from FromJson
  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // Appends the ids of one pre-tokenized piece of raw bytes. Safe to call from several threads.
  void Encode(std::string_view piece, std::vector<int32_t>& out) const;

  // Byte-level token string -> id.
  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  const ByteLevelAlphabet& alphabet() const { return alphabet_; }

 private:
  std::vector<int32_t> Merge(std::string_view piece) const;

  struct MergeRule {
    int32_t rank;    // position in the merges list: lower merges first
    int32_t result;  // id of the merged token
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  ByteLevelAlphabet alphabet_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<uint64_t, MergeRule> merges_;
  // Hugging Face's ignore_merges: a piece that is itself in the vocab is taken whole.
  bool ignore_merges_ = false;

  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace moe
