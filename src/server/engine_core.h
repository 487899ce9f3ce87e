// The engine core process's loop: takes requests and aborts from the API servers over ZeroMQ,
// steps the engine whenever it has work, and sends every API server the new tokens of its
// requests after each step. It never waits on an API server: sends are queued by ZeroMQ.
#pragma once

#include <atomic>
#include <string>

#include "base/status.h"
#include "dist/communicator.h"
#include "engine/engine.h"
#include "engine/expert_load.h"
#include "server/engine_messages.h"

namespace moe {

struct EngineEndpoints {
  std::string requests;  // the engine binds a PULL socket here: submits, aborts, metrics queries
  std::string outputs;   // and a ROUTER here: hellos in; info, step outputs and metrics out
};

// Endpoints for engine rank `rank` and the API servers on one host: IPC sockets under `dir`.
EngineEndpoints IpcEndpoints(const std::string& dir, int rank);
// TCP endpoints, for API servers on other hosts: requests at `port`, outputs at `port + 1`.
EngineEndpoints TcpEndpoints(const std::string& host, int port);

struct EngineCoreOptions {
  EngineEndpoints endpoints;
  EngineInfo info;             // sent to each API server that says hello
  int64_t max_waiting = 1024;  // submits beyond this many waiting requests get a 429
};

// Runs until rank 0's `stop` is set (other ranks' flags are ignored: every rank must leave the loop
// at the same step, and rank 0 decides when its API servers have drained). All ranks of `comm`
// step together: a step runs on every rank when any has work. Fails only if the sockets cannot be
// bound.
Status RunEngineCore(Engine& engine, const ExpertLoadCounter& expert_load, const EngineCoreOptions& options,
                     Communicator& comm, const std::atomic<bool>& stop);

}  // namespace moe
