#include "server/engine_core.h"

#include <chrono>
#include <map>
#include <set>
#include <unordered_map>

#include <spdlog/spdlog.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "server/metrics.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

// With no work, the loop still wakes this often, and tells every API server its load so that
// silence means the engine is gone.
constexpr auto kHeartbeat = std::chrono::milliseconds(200);

constexpr auto kLockstepIdleWait = std::chrono::milliseconds(5);
// Each rank's word in the per-iteration all-reduce (max): any rank stopping outranks any working.
constexpr int64_t kWorkFlag = 1, kStopFlag = 2;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

class EngineCore {
 public:
  EngineCore(Engine& engine, const ExpertLoadCounter& expert_load, const EngineCoreOptions& options,
             Communicator& comm)
      : engine_(engine), expert_load_(expert_load), options_(options), comm_(comm) {}

  Status Run(const std::atomic<bool>& stop) {
    try {
      requests_.bind(options_.endpoints.requests);
      outputs_.set(zmq::sockopt::router_mandatory, 1);  // a send to a gone API server fails
      outputs_.set(zmq::sockopt::sndhwm, 0);             // never block the step loop on a slow one
      outputs_.set(zmq::sockopt::linger, 0);             // nor the exit on a gone one
      outputs_.bind(options_.endpoints.outputs);
    } catch (const zmq::error_t& e) {
      return Status::Error("engine core: cannot bind its sockets " + options_.endpoints.requests + " and " +
                           options_.endpoints.outputs + ": " + e.what());
    }
    spdlog::info("engine rank {} of {}: listening on {} (requests) and {} (outputs)", comm_.rank(), comm_.size(),
                 options_.endpoints.requests, options_.endpoints.outputs);
    auto last_heartbeat = Clock::now();
    // An idle rank of several listens this long between asking the others whether any has work.
    const auto idle_wait = comm_.size() > 1 ? kLockstepIdleWait : kHeartbeat;
    while (true) {
      const bool busy = engine_.HasUnfinishedRequests();
      zmq::pollitem_t items[] = {{requests_.handle(), 0, ZMQ_POLLIN, 0}, {outputs_.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, busy ? std::chrono::milliseconds(0) : idle_wait);
      DrainRequests();
      DrainHellos();
      // An abort's output comes out of the next step: take it even when nothing else runs, or the
      // abort would go uncounted (and its load unreleased) until the next request. Every rank
      // steps when any has work (the experts' exchanges need them all), and all leave together.
      const bool has_work = engine_.HasUnfinishedRequests() || aborted_;
      const int64_t flags = comm_.AllReduceMax((stop.load() ? kStopFlag : 0) | (has_work ? kWorkFlag : 0));
      if (flags >= kStopFlag) break;
      const bool stepped = flags == kWorkFlag;
      if (stepped) Step();
      aborted_ = false;
      // Every API server hears the load after each step (it routes by it), and at least every
      // heartbeat (silence means the engine is gone).
      if (stepped || Clock::now() - last_heartbeat >= kHeartbeat) {
        for (const std::string& client : clients_) pending_[client];
        last_heartbeat = Clock::now();
      }
      Flush();
    }
    return Status::Ok();
  }

 private:
  struct Tracked {
    std::string client;
    Clock::time_point arrival, last_token;
    int64_t num_outputs = 0;
    int64_t num_prompt = 0;
  };

  void DrainRequests() {
    zmq::message_t message;
    while (requests_.recv(message, zmq::recv_flags::dontwait)) {
      auto decoded = DecodeToEngine(message.to_string_view());
      if (!decoded.ok()) {
        spdlog::error("{}", decoded.status().message());
        continue;
      }
      if (auto* submit = std::get_if<SubmitMessage>(&*decoded)) {
        Submit(std::move(*submit));
      } else if (auto* abort = std::get_if<AbortMessage>(&*decoded)) {
        for (RequestId id : abort->ids) engine_.Abort(id);
        aborted_ = true;
      } else if (auto* query = std::get_if<MetricsQuery>(&*decoded)) {
        SendTo(query->client, Encode(FromEngine(MetricsReply{query->query_id, RenderMetrics()})));
      }
    }
  }

  void DrainHellos() {
    std::vector<zmq::message_t> parts;
    while (zmq::recv_multipart(outputs_, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
      if (parts.size() == 2) {
        auto decoded = DecodeToEngine(parts[1].to_string_view());
        if (decoded.ok() && std::holds_alternative<HelloMessage>(*decoded)) {
          const std::string client = parts[0].to_string();
          spdlog::info("API server {} connected", client);
          clients_.insert(client);
          SendTo(client, Encode(FromEngine(options_.info)));
        }
      }
      parts.clear();
    }
  }

  void Submit(SubmitMessage submit) {
    const RequestId id = submit.request.id;
    const int64_t prompt_tokens = static_cast<int64_t>(submit.request.prompt.size());
    if (engine_.scheduler().num_waiting() >= options_.max_waiting) {
      pending_[submit.client].errors.push_back(
          {id, 429, "the server is at capacity: " + std::to_string(options_.max_waiting) + " requests are waiting"});
      return;
    }
    if (Status s = engine_.AddRequest(std::move(submit.request)); !s.ok()) {
      pending_[submit.client].errors.push_back({id, 400, s.message()});
      return;
    }
    metrics_.AddPromptTokens(prompt_tokens);
    const auto now = Clock::now();
    tracked_[id] = {submit.client, now, now, 0, prompt_tokens};
    load_tokens_ += prompt_tokens;
  }

  void Step() {
    const auto start = Clock::now();
    std::vector<RequestOutput> outputs = engine_.Step();
    const auto now = Clock::now();
    metrics_.CountStep(Seconds(now - start));
    for (RequestOutput& out : outputs) {
      auto it = tracked_.find(out.id);
      if (it == tracked_.end()) continue;  // its API server is gone
      Tracked& t = it->second;
      const auto n = static_cast<int64_t>(out.new_token_ids.size());
      if (n > 0) {
        if (t.num_outputs == 0) {
          metrics_.ObserveTimeToFirstToken(Seconds(now - t.arrival));
        } else {
          metrics_.ObserveInterTokenLatency(Seconds(now - t.last_token) / static_cast<double>(n));
        }
        t.num_outputs += n;
        t.last_token = now;
        load_tokens_ += n;
        metrics_.AddGenerationTokens(n);
      }
      if (out.finished) {
        metrics_.ObserveEndToEnd(Seconds(now - t.arrival));
        metrics_.CountFinished(out.finish_reason);
      }
      const std::string client = t.client;
      if (out.finished) {
        load_tokens_ -= t.num_prompt + t.num_outputs;
        tracked_.erase(it);
      }
      pending_[client].outputs.push_back(std::move(out));
    }
  }

  // One message per API server per step: all its requests' new tokens, and the engine's load.
  void Flush() {
    const EngineLoad load{engine_.scheduler().num_running(), engine_.scheduler().num_waiting(),
                          engine_.scheduler().kv_cache().usage(), load_tokens_};
    for (auto& [client, step] : pending_) {
      step.load = load;
      SendTo(client, Encode(FromEngine(std::move(step))));
    }
    pending_.clear();
  }

  void SendTo(const std::string& client, const std::string& payload) {
    try {
      outputs_.send(zmq::buffer(client), zmq::send_flags::sndmore);
      outputs_.send(zmq::buffer(payload), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      if (e.num() != EHOSTUNREACH) throw;
      Forget(client);
    }
  }

  // An API server that went away: nobody can read its requests' tokens, so they stop now.
  void Forget(const std::string& client) {
    if (clients_.erase(client) == 0) return;
    spdlog::warn("API server {} is gone; aborting its requests", client);
    for (auto it = tracked_.begin(); it != tracked_.end();) {
      if (it->second.client == client) {
        engine_.Abort(it->first);
        load_tokens_ -= it->second.num_prompt + it->second.num_outputs;
        it = tracked_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::string RenderMetrics() const {
    const auto& kv = engine_.scheduler().kv_cache();
    EngineGauges g;
    g.num_running = engine_.scheduler().num_running();
    g.num_waiting = engine_.scheduler().num_waiting();
    g.kv_cache_usage = kv.usage();
    g.kv_capacity_tokens = engine_.kv_capacity_tokens();
    g.prefix_queried_tokens = kv.prefix_cache_stats().queried_tokens;
    g.prefix_hit_tokens = kv.prefix_cache_stats().hit_tokens;
    g.num_preemptions = engine_.num_preemptions();
    g.moe_exchange_seconds = expert_load_.exchange_seconds();
    return metrics_.Render(g, expert_load_.Snapshot());
  }

  Engine& engine_;
  const ExpertLoadCounter& expert_load_;
  const EngineCoreOptions& options_;
  Communicator& comm_;
  zmq::context_t context_{1};
  zmq::socket_t requests_{context_, zmq::socket_type::pull};
  zmq::socket_t outputs_{context_, zmq::socket_type::router};
  std::set<std::string> clients_;
  std::unordered_map<RequestId, Tracked> tracked_;
  bool aborted_ = false;  // requests were aborted since the last step
  int64_t load_tokens_ = 0;  // prompt and output tokens of tracked requests
  std::map<std::string, StepMessage> pending_;
  ServingMetrics metrics_;
};

}  // namespace

EngineEndpoints IpcEndpoints(const std::string& dir, int rank) {
  const std::string rank_suffix = std::to_string(rank);
  return {"ipc://" + dir + "/requests-" + rank_suffix, "ipc://" + dir + "/outputs-" + rank_suffix};
}

EngineEndpoints TcpEndpoints(const std::string& host, int port) {
  const std::string prefix = "tcp://" + host + ":";
  return {prefix + std::to_string(port), prefix + std::to_string(port + 1)};
}

Status RunEngineCore(Engine& engine, const ExpertLoadCounter& expert_load, const EngineCoreOptions& options,
                     Communicator& comm, const std::atomic<bool>& stop) {
  EngineCore core(engine, expert_load, options, comm);
  return core.Run(stop);
}

}  // namespace moe
