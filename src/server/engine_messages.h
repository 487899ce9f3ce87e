// The typed messages between the API-server processes and the engine core, and their wire form
// (MessagePack). API servers send requests and aborts; the engine answers each step with the new
// tokens of every request it runs for that API server, plus load figures.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"

namespace moe {

// API server -> engine.
struct HelloMessage {  // first message of an API server, on the outputs socket
  std::string client;
};
struct SubmitMessage {
  std::string client;  // the API server that gets the outputs
  EngineRequest request;
};
struct AbortMessage {
  std::vector<RequestId> ids;
};
struct MetricsQuery {
  std::string client;
  uint64_t query_id = 0;
};
using ToEngine = std::variant<HelloMessage, SubmitMessage, AbortMessage, MetricsQuery>;

// Engine -> API server.
struct EngineInfo {  // the answer to HelloMessage: the engine is ready
  std::string model;
  int64_t max_model_len = 0;
  int32_t vocab_size = 0;
  int64_t kv_capacity_tokens = 0;
};
struct EngineLoad {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  double kv_cache_usage = 0;  // fraction of blocks in use
  int64_t num_tokens = 0;     // prompt and generated tokens of its unfinished requests
};
// A request the engine refused or could not run. `status` is the HTTP status it maps to.
struct RequestError {
  RequestId id = 0;
  int status = 400;
  std::string message;
};
struct StepMessage {
  std::vector<RequestOutput> outputs;
  std::vector<RequestError> errors;
  EngineLoad load;
};
struct MetricsReply {
  uint64_t query_id = 0;
  std::string text;  // Prometheus exposition format
};
using FromEngine = std::variant<EngineInfo, StepMessage, MetricsReply>;

std::string Encode(const ToEngine& message);
std::string Encode(const FromEngine& message);
// Fail, naming the field, on bytes that are not a message of that direction.
Expected<ToEngine> DecodeToEngine(std::string_view bytes);
Expected<FromEngine> DecodeFromEngine(std::string_view bytes);

}  // namespace moe
