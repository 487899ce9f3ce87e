#include "server/engine_client.h"

#include <cstring>

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

namespace moe {

std::optional<StreamEvent> RequestStream::Next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  StreamEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

void RequestStream::Push(StreamEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  ready_.notify_one();
}

EngineClient::EngineClient(const EngineEndpoints& endpoints, std::string client_id,
                           std::chrono::milliseconds liveness_timeout)
    : client_id_(std::move(client_id)),
      liveness_timeout_(liveness_timeout),
      outputs_(context_, zmq::socket_type::dealer),
      monitor_(context_, zmq::socket_type::pair),
      requests_(context_, zmq::socket_type::push) {
  outputs_.set(zmq::sockopt::routing_id, client_id_);
  outputs_.set(zmq::sockopt::rcvhwm, 0);
  const std::string monitor_address = "inproc://engine-monitor";
  if (zmq_socket_monitor(outputs_.handle(), monitor_address.c_str(), ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) !=
      0) {
    throw zmq::error_t();
  }
  monitor_.connect(monitor_address);
  outputs_.connect(endpoints.outputs);
  requests_.set(zmq::sockopt::sndhwm, 0);
  // Messages still queued for a gone engine (a hello, an abort) must not hold up this process's
  // exit: by default closing the context waits for them forever.
  requests_.set(zmq::sockopt::linger, 0);
  outputs_.set(zmq::sockopt::linger, 0);
  requests_.connect(endpoints.requests);
  thread_ = std::thread([this] { Loop(); });
}

EngineClient::~EngineClient() {
  stop_ = true;
  thread_.join();
}

std::optional<EngineInfo> EngineClient::info() const {
  std::lock_guard lock(mutex_);
  return info_;
}

std::string EngineClient::unavailable_reason() const {
  std::lock_guard lock(mutex_);
  return unavailable_;
}

std::pair<EngineLoad, uint64_t> EngineClient::load() const {
  std::lock_guard lock(mutex_);
  return {load_, load_reports_};
}

void EngineClient::Submit(EngineRequest request, std::shared_ptr<RequestStream> stream) {
  {
    std::lock_guard lock(mutex_);
    if (!info_) {
      stream->Push(StreamEvent::Failed(request.id, 503, unavailable_));
      return;
    }
    streams_[request.id] = std::move(stream);
  }
  Send(SubmitMessage{client_id_, std::move(request)});
}

void EngineClient::Abort(std::span<const RequestId> ids) {
  {
    std::lock_guard lock(mutex_);
    for (RequestId id : ids) streams_.erase(id);
  }
  Send(AbortMessage{{ids.begin(), ids.end()}});
}

Expected<std::string> EngineClient::Metrics(std::chrono::milliseconds timeout) {
  std::future<std::string> reply;
  uint64_t query_id;
  {
    std::lock_guard lock(mutex_);
    if (!info_) return Status::Error(unavailable_);
    query_id = next_query_++;
    reply = metrics_queries_[query_id].get_future();
  }
  Send(MetricsQuery{client_id_, query_id});
  const bool answered = reply.wait_for(timeout) == std::future_status::ready;
  std::lock_guard lock(mutex_);
  metrics_queries_.erase(query_id);
  if (!answered) return Status::Error("the engine did not answer the metrics query in time");
  return reply.get();
}

void EngineClient::Send(const ToEngine& message) {
  const std::string bytes = Encode(message);
  std::lock_guard lock(send_mutex_);
  requests_.send(zmq::buffer(bytes), zmq::send_flags::none);
}

void EngineClient::Loop() {
  while (!stop_.load()) {
    zmq::pollitem_t items[] = {{outputs_.handle(), 0, ZMQ_POLLIN, 0}, {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, std::chrono::milliseconds(100));
    zmq::message_t message;
    while (outputs_.recv(message, zmq::recv_flags::dontwait)) {
      auto decoded = DecodeFromEngine(message.to_string_view());
      if (!decoded.ok()) {
        spdlog::error("{}", decoded.status().message());
        continue;
      }
      Receive(std::move(*decoded));
    }
    // Every connection, the first or one to an engine that came back, starts with a hello: the
    // engine answers it with its info, which makes this client available.
    std::vector<zmq::message_t> event;
    while (zmq::recv_multipart(monitor_, std::back_inserter(event), zmq::recv_flags::dontwait)) {
      uint16_t id = 0;
      std::memcpy(&id, event[0].data(), sizeof(id));  // the first frame: event id, then its value
      if (id == ZMQ_EVENT_CONNECTED) {
        outputs_.send(zmq::buffer(Encode(ToEngine(HelloMessage{client_id_}))), zmq::send_flags::none);
      } else {
        MarkGone("the engine process disconnected");
      }
      event.clear();
    }
    bool silent;
    {
      std::lock_guard lock(mutex_);
      silent = info_ && std::chrono::steady_clock::now() - last_heard_ > liveness_timeout_;
    }
    if (silent) MarkGone("the engine has not answered for " + std::to_string(liveness_timeout_.count()) + " ms");
  }
}

void EngineClient::Receive(FromEngine message) {
  std::lock_guard lock(mutex_);
  last_heard_ = std::chrono::steady_clock::now();
  if (auto* info = std::get_if<EngineInfo>(&message)) {
    if (!info_) {
      spdlog::info("engine ready: model {}, context {} tokens", info->model, info->max_model_len);
      info_ = std::move(*info);
      unavailable_.clear();
    }
  } else if (auto* step = std::get_if<StepMessage>(&message)) {
    load_ = step->load;
    ++load_reports_;
    for (RequestError& error : step->errors) {
      auto it = streams_.find(error.id);
      if (it == streams_.end()) continue;
      it->second->Push(StreamEvent::Failed(error.id, error.status, std::move(error.message)));
      streams_.erase(it);
    }
    for (RequestOutput& out : step->outputs) {
      auto it = streams_.find(out.id);
      if (it == streams_.end()) continue;  // aborted here meanwhile
      const bool finished = out.finished;
      it->second->Push({std::move(out), std::nullopt});
      if (finished) streams_.erase(it);
    }
  } else if (auto* reply = std::get_if<MetricsReply>(&message)) {
    auto it = metrics_queries_.find(reply->query_id);
    if (it != metrics_queries_.end()) it->second.set_value(std::move(reply->text));
  }
}

void EngineClient::MarkGone(const std::string& reason) {
  std::lock_guard lock(mutex_);
  if (!unavailable_.empty() && unavailable_ != "the engine is starting") return;
  spdlog::error("engine unavailable: {}", reason);
  info_.reset();
  unavailable_ = "the engine is unavailable: " + reason;
  for (auto& [id, stream] : streams_) stream->Push(StreamEvent::Failed(id, 503, unavailable_));
  streams_.clear();
}

}  // namespace moe
