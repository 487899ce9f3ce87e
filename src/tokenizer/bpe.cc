#include "tokenizer/bpe.h"

#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <shared_mutex>

namespace moe {
namespace {

// Words repeat a lot in natural text; long pieces (digit runs, whitespace) rarely do, and
// bounding both keeps the cache's memory bounded.
constexpr size_t kMaxCachedPieceBytes = 256;
constexpr size_t kMaxCacheEntries = 1 << 16;

Status CheckAbsentOrNull(const nlohmann::json& model, const char* key, const char* why) {
  const auto it = model.find(key);
  if (it == model.end() || it->is_null()) return Status::Ok();
  if (it->is_string() && it->get<std::string>().empty()) return Status::Ok();
  if (it->is_boolean() && !it->get<bool>()) return Status::Ok();
  return Status::Error(std::string("unsupported BPE option ") + key + ": " + it->dump() + " (" +
                       why + ")");
}

// Splits a merges entry into its two tokens.
Expected<std::pair<std::string, std::string>> ParseMerge(const nlohmann::json& entry) {
  if (entry.is_string()) {
    const std::string& line = entry.get_ref<const std::string&>();
    const size_t space = line.find(' ');
    if (space != std::string::npos && line.find(' ', space + 1) == std::string::npos) {
      return std::make_pair(line.substr(0, space), line.substr(space + 1));
    }
  } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
             entry[1].is_string()) {
    return std::make_pair(entry[0].get<std::string>(), entry[1].get<std::string>());
  }
  return Status::Error("is not \"a b\" or [\"a\", \"b\"]");
}

}  // namespace

struct BpeModel::Cache {
  std::shared_mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>> pieces;
};

BpeModel::BpeModel() : cache_(std::make_unique<Cache>()) {}
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

Expected<BpeModel> BpeModel::FromJson(const nlohmann::json& model) {
  if (!model.is_object()) return Status::Error("model is not an object");
  const auto type = model.find("type");
  if (type == model.end() || *type != "BPE") {
    return Status::Error("unsupported model type " +
                         (type == model.end() ? std::string("(none)") : type->dump()) +
                         " (only BPE is supported)");
  }
  MOE_RETURN_IF_ERROR(CheckAbsentOrNull(model, "dropout", "encoding must be deterministic"));
  MOE_RETURN_IF_ERROR(CheckAbsentOrNull(model, "byte_fallback", "only byte-level BPE"));
  MOE_RETURN_IF_ERROR(CheckAbsentOrNull(model, "continuing_subword_prefix", "only byte-level BPE"));
  MOE_RETURN_IF_ERROR(CheckAbsentOrNull(model, "end_of_word_suffix", "only byte-level BPE"));

  BpeModel bpe;
  if (const auto it = model.find("ignore_merges"); it != model.end() && it->is_boolean()) {
    bpe.ignore_merges_ = it->get<bool>();
  }

  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object())
    return Status::Error("model has no vocab object");
  bpe.vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX) {
      return Status::Error("vocab entry '" + token + "' has id " + id.dump() +
                           ", not an integer in [0, 2^31 - 1)");
    }
    bpe.vocab_.emplace(token, id.get<int32_t>());
  }

  for (int b = 0; b < 256; ++b) {
    const auto it = bpe.vocab_.find(bpe.alphabet_.Char(static_cast<uint8_t>(b)));
    if (it == bpe.vocab_.end()) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", b);
      return Status::Error(std::string("vocab lacks the byte-level token '") +
                           bpe.alphabet_.Char(static_cast<uint8_t>(b)) + "' for byte " + hex +
                           " (only byte-level BPE is supported)");
    }
    bpe.byte_ids_[b] = it->second;
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return Status::Error("model has no merges array");
  }
  bpe.merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const nlohmann::json& entry = (*merges)[rank];
    const std::string where = "merges[" + std::to_string(rank) + "] " + entry.dump();
    auto parts = ParseMerge(entry);
    if (!parts.ok()) return parts.status().WithContext(where);
    const auto& [left, right] = *parts;
    int32_t ids[3];
    const std::string tokens[3] = {left, right, left + right};
    for (int k = 0; k < 3; ++k) {
      const auto it = bpe.vocab_.find(tokens[k]);
      if (it == bpe.vocab_.end()) {
        return Status::Error(where + ": token '" + tokens[k] + "' is not in the vocab");
      }
      ids[k] = it->second;
    }
    // A repeated pair keeps its last rank, as Hugging Face's tokenizers do.
    bpe.merges_[PairKey(ids[0], ids[1])] = {static_cast<int32_t>(rank), ids[2]};
  }
  return bpe;
}

std::vector<int32_t> BpeModel::Merge(std::string_view piece) const {
  // The piece's bytes as a linked list of symbols; a merge folds a symbol into its left neighbour.
  struct Symbol {
    int32_t id;
    int prev, next;  // -1 at the ends
    bool alive;
  };
  std::vector<Symbol> symbols(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    symbols[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], static_cast<int>(i) - 1,
                  i + 1 < piece.size() ? static_cast<int>(i) + 1 : -1, true};
  }

  // Candidate merges, lowest rank first and leftmost among equal ranks. Entries go stale when a
  // neighbour changes; they are checked against the symbols when popped.
  struct Candidate {
    int32_t rank;
    int pos;  // the left symbol
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto find_rule = [&](int pos) -> const MergeRule* {
    const int next = symbols[pos].next;
    if (next < 0) return nullptr;
    const auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    return it == merges_.end() ? nullptr : &it->second;
  };
  const auto push = [&](int pos) {
    if (const MergeRule* rule = find_rule(pos)) queue.push({rule->rank, pos});
  };
  for (size_t i = 0; i + 1 < piece.size(); ++i) push(static_cast<int>(i));

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (!symbols[top.pos].alive) continue;
    const MergeRule* rule = find_rule(top.pos);
    if (rule == nullptr || rule->rank != top.rank) continue;

    Symbol& left = symbols[top.pos];
    Symbol& right = symbols[left.next];
    left.id = rule->result;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }

  std::vector<int32_t> ids;
  for (int pos = 0; pos >= 0; pos = symbols[pos].next) ids.push_back(symbols[pos].id);
  return ids;
}

void BpeModel::Encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    if (const auto it = vocab_.find(alphabet_.Encode(piece)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::shared_lock lock(cache_->mutex);
    if (const auto it = cache_->pieces.find(std::string(piece)); it != cache_->pieces.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = Merge(piece);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_->mutex);
    // Starting over is crude but keeps memory bounded without bookkeeping on every hit.
    if (cache_->pieces.size() >= kMaxCacheEntries) cache_->pieces.clear();
    cache_->pieces.emplace(piece, std::move(ids));
  }
}

}  // namespace moe
