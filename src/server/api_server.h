// One API-server process: the OpenAI HTTP API over an EngineClient. It tokenizes, applies the
// chat template, detokenizes incrementally, matches stop strings and streams SSE; the engine
// only ever sees token ids. Several of these share one port (SO_REUSEPORT).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "server/engine_group.h"
#include "tokenizer/tokenizer.h"

namespace moe {

struct ApiServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;  // empty: no authentication
  std::string served_model;
  int64_t max_body_bytes = 4 << 20;
  int64_t max_n = 16;
  int64_t max_logprobs = 20;
  int threads = 512;  // concurrent connections served; each stream holds one
  // After SIGTERM: how long in-flight requests may still finish before they are aborted.
  std::chrono::milliseconds shutdown_grace{std::chrono::seconds(30)};
  // Created (empty) once the port is bound: a supervisor tells a start-up failure from a crash by it.
  std::string ready_file;
};

// Serves until SIGTERM or SIGINT, then drains (see shutdown_grace) and returns. Fails when the
// port cannot be bound.
Status RunApiServer(const Tokenizer& tokenizer, EngineGroup& engine, const ApiServerOptions& options);

}  // namespace moe
