// The engine ranks of one instance as an API server sees them: each rank is a data-parallel
// engine with its own requests and KV cache, so each HTTP request goes to the least-loaded rank
// (prompt and generated tokens of its unfinished requests, as the ranks last reported plus what
// was sent since). The instance serves only while every rank does: expert parallelism needs all.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "server/engine_client.h"

namespace moe {

class EngineGroup {
 public:
  // One endpoint pair per rank, by rank; at most 256 ranks (the rank travels in request ids).
  EngineGroup(const std::vector<EngineEndpoints>& ranks, const std::string& client_id,
              std::chrono::milliseconds liveness_timeout);

  // Rank 0's description once every rank has answered, while all are alive.
  std::optional<EngineInfo> info() const;
  std::string unavailable_reason() const;

  // Sends the requests (their ids are assigned here) to one rank, so that they share its prefix
  // cache; their events arrive on `stream`. Returns the ids, in order.
  std::vector<RequestId> Submit(std::vector<EngineRequest> requests, std::shared_ptr<RequestStream> stream);
  void Abort(std::span<const RequestId> ids);
  // Every rank's metrics, each sample labelled with its rank.
  Expected<std::string> Metrics(std::chrono::milliseconds timeout);

 private:
  int LeastLoaded();

  std::vector<std::unique_ptr<EngineClient>> ranks_;
  std::mutex mutex_;
  std::vector<int64_t> sent_since_report_;  // tokens sent to each rank since its last load report
  std::vector<uint64_t> last_report_;
  uint64_t next_id_ = 0;
  size_t rotation_ = 0;
};

// Prometheus texts of several ranks as one: each metric's HELP and TYPE once, then its samples
// from every rank with a rank="r" label.
std::string MergeRankMetrics(const std::vector<std::string>& texts);

}  // namespace moe
