#include "server/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace moe {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopMatcher::Result StopMatcher::Push(std::string_view piece) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  if (stops_.empty()) {
    result.text = piece;
    return result;
  }
  held_.append(piece);

  // Every possible match start lies in the held text or the new piece: text before the held part
  // was emitted only because no stop string could start there.
  size_t best_end = std::string::npos, best_pos = 0;
  const std::string* best = nullptr;
  for (const std::string& s : stops_) {
    size_t pos = held_.find(s);
    if (pos == std::string::npos) continue;
    size_t end = pos + s.size();
    if (best == nullptr || end < best_end || (end == best_end && pos < best_pos)) {
      best = &s;
      best_end = end;
      best_pos = pos;
    }
  }
  if (best != nullptr) {
    result.text = held_.substr(0, best_pos);
    result.stopped = true;
    stopped_ = true;
    matched_ = *best;
    held_.clear();
    return result;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t max_keep = 0;
  for (const std::string& s : stops_) max_keep = std::max(max_keep, std::min(s.size() - 1, held_.size()));
  size_t keep = 0;
  for (size_t k = max_keep; k > 0 && keep == 0; --k) {
    std::string_view tail = std::string_view(held_).substr(held_.size() - k);
    for (const std::string& s : stops_) {
      if (s.size() > k && std::string_view(s).substr(0, k) == tail) {
        keep = k;
        break;
      }
    }
  }
  result.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return result;
}

std::string StopMatcher::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace moe
