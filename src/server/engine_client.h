// An API server's link to the engine core: submits requests, aborts them, and hands each request's
// tokens to the HTTP thread that serves it. One I/O thread owns the receiving socket; HTTP
// threads only send (under a lock) and wait on their request's stream.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>

#include <zmq.hpp>

#include "base/status.h"
#include "server/engine_core.h"
#include "server/engine_messages.h"

namespace moe {

// What a request's stream yields: new tokens (possibly the last), or an error that ends it.
struct StreamEvent {
  RequestOutput output;
  std::optional<RequestError> error;

  static StreamEvent Failed(RequestId id, int status, std::string message) {
    StreamEvent event;
    event.output.id = id;
    event.error = RequestError{id, status, std::move(message)};
    return event;
  }
};

class RequestStream {
 public:
  // The next event, or nothing if none came within `timeout`.
  std::optional<StreamEvent> Next(std::chrono::milliseconds timeout);
  void Push(StreamEvent event);

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<StreamEvent> events_;
};

class EngineClient {
 public:
  // `client_id` names this API server to the engine; unique among the live ones. The engine is
  // declared gone when its connection drops or it is silent for `liveness_timeout`, and available
  // again when an engine (re)connects and answers this client's hello.
  EngineClient(const EngineEndpoints& endpoints, std::string client_id, std::chrono::milliseconds liveness_timeout);
  ~EngineClient();

  // The engine's description once it answered, while it is alive.
  std::optional<EngineInfo> info() const;
  // Why info() is empty: starting, or gone (and why).
  std::string unavailable_reason() const;
  // The last load the engine reported, and how many reports came so far.
  std::pair<EngineLoad, uint64_t> load() const;
  // Sends the request; its events arrive on `stream`, which several requests may share (the
  // choices of one HTTP request). When the engine is unavailable the stream gets a 503 at once.
  void Submit(EngineRequest request, std::shared_ptr<RequestStream> stream);
  void Abort(std::span<const RequestId> ids);
  // The engine's metrics in Prometheus text format.
  Expected<std::string> Metrics(std::chrono::milliseconds timeout);

 private:
  void Loop();
  void Receive(FromEngine message);
  void MarkGone(const std::string& reason);
  void Send(const ToEngine& message);

  const std::string client_id_;
  const std::chrono::milliseconds liveness_timeout_;
  zmq::context_t context_{1};
  zmq::socket_t outputs_;  // DEALER, only the I/O thread uses it
  zmq::socket_t monitor_;  // PAIR fed by ZeroMQ's monitor of outputs_, only the I/O thread
  std::mutex send_mutex_;
  zmq::socket_t requests_;  // PUSH, under send_mutex_

  mutable std::mutex mutex_;
  std::optional<EngineInfo> info_;
  std::string unavailable_ = "the engine is starting";
  EngineLoad load_;
  uint64_t load_reports_ = 0;
  std::unordered_map<RequestId, std::shared_ptr<RequestStream>> streams_;
  std::unordered_map<uint64_t, std::promise<std::string>> metrics_queries_;
  uint64_t next_query_ = 0;
  std::chrono::steady_clock::time_point last_heard_;

  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace moe
