#include "server/engine_group.h"

#include <unistd.h>

#include <limits>
#include <map>

#include "base/check.h"

namespace moe {
namespace {

constexpr int kMaxRanks = 256;

int RankOf(RequestId id) { return static_cast<int>(id & 0xff); }

// Adds rank="r" to one sample line: name{a="b"} v -> name{rank="r",a="b"} v.
std::string LabelRank(const std::string& line, int rank) {
  const std::string label = "rank=\"" + std::to_string(rank) + "\"";
  const size_t brace = line.find('{'), space = line.find(' ');
  if (brace != std::string::npos && brace < space) return line.substr(0, brace + 1) + label + "," + line.substr(brace + 1);
  return line.substr(0, space) + "{" + label + "}" + line.substr(space);
}

}  // namespace

EngineGroup::EngineGroup(const std::vector<EngineEndpoints>& ranks, const std::string& client_id,
                         std::chrono::milliseconds liveness_timeout)
    : sent_since_report_(ranks.size(), 0), last_report_(ranks.size(), 0) {
  MOE_CHECK(!ranks.empty() && ranks.size() <= kMaxRanks, "engine ranks: %zu", ranks.size());
  for (const EngineEndpoints& endpoints : ranks) {
    ranks_.push_back(std::make_unique<EngineClient>(endpoints, client_id, liveness_timeout));
  }
}

std::optional<EngineInfo> EngineGroup::info() const {
  for (const auto& rank : ranks_) {
    if (!rank->info()) return std::nullopt;
  }
  return ranks_[0]->info();
}

std::string EngineGroup::unavailable_reason() const {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!ranks_[r]->info()) {
      const std::string reason = ranks_[r]->unavailable_reason();
      return ranks_.size() == 1 ? reason : "rank " + std::to_string(r) + ": " + reason;
    }
  }
  return "";
}

// Ties go round-robin, so that requests to an idle instance spread over its ranks.
int EngineGroup::LeastLoaded() {
  int best = 0;
  int64_t best_load = std::numeric_limits<int64_t>::max();
  const size_t n = ranks_.size();
  ++rotation_;
  for (size_t i = 0; i < n; ++i) {
    const size_t r = (rotation_ + i) % n;
    const auto [load, reports] = ranks_[r]->load();
    if (reports != last_report_[r]) {
      last_report_[r] = reports;
      sent_since_report_[r] = 0;
    }
    if (load.num_tokens + sent_since_report_[r] < best_load) {
      best_load = load.num_tokens + sent_since_report_[r];
      best = static_cast<int>(r);
    }
  }
  return best;
}

// Ids: this process's pid (unique among the live API servers of a host), a counter, and the rank.
std::vector<RequestId> EngineGroup::Submit(std::vector<EngineRequest> requests, std::shared_ptr<RequestStream> stream) {
  std::vector<RequestId> ids;
  int rank;
  {
    std::lock_guard lock(mutex_);
    rank = LeastLoaded();
    for (EngineRequest& r : requests) {
      r.id = (static_cast<RequestId>(getpid()) << 32) | static_cast<RequestId>((next_id_++ & 0xffffff) << 8) | rank;
      ids.push_back(r.id);
      sent_since_report_[rank] += static_cast<int64_t>(r.prompt.size());
    }
  }
  for (EngineRequest& r : requests) ranks_[rank]->Submit(std::move(r), stream);
  return ids;
}

void EngineGroup::Abort(std::span<const RequestId> ids) {
  std::map<int, std::vector<RequestId>> by_rank;
  for (RequestId id : ids) by_rank[RankOf(id)].push_back(id);
  for (const auto& [rank, rank_ids] : by_rank) ranks_[rank]->Abort(rank_ids);
}

Expected<std::string> EngineGroup::Metrics(std::chrono::milliseconds timeout) {
  std::vector<std::string> texts;
  for (const auto& rank : ranks_) {
    MOE_ASSIGN_OR_RETURN(std::string text, rank->Metrics(timeout));
    texts.push_back(std::move(text));
  }
  return ranks_.size() == 1 ? texts[0] : MergeRankMetrics(texts);
}

std::string MergeRankMetrics(const std::vector<std::string>& texts) {
  // Each text is a run of metrics, each a HELP line, a TYPE line and its samples, in the same
  // order on every rank (they run the same code).
  std::vector<std::vector<std::vector<std::string>>> metrics(texts.size());  // rank, metric, lines
  for (size_t r = 0; r < texts.size(); ++r) {
    size_t start = 0;
    while (start < texts[r].size()) {
      const size_t end = texts[r].find('\n', start);
      const std::string line = texts[r].substr(start, end - start);
      start = end == std::string::npos ? texts[r].size() : end + 1;
      if (line.rfind("# HELP", 0) == 0) metrics[r].emplace_back();
      if (!metrics[r].empty()) metrics[r].back().push_back(line);
    }
  }
  std::string out;
  for (size_t m = 0; m < metrics[0].size(); ++m) {
    for (size_t r = 0; r < texts.size(); ++r) {
      if (m >= metrics[r].size()) continue;
      for (const std::string& line : metrics[r][m]) {
        if (line.rfind("#", 0) == 0) {
          if (r == 0) out += line + "\n";
        } else {
          out += LabelRank(line, static_cast<int>(r)) + "\n";
        }
      }
    }
  }
  return out;
}

}  // namespace moe
