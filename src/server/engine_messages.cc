#include "server/engine_messages.h"

#include <nlohmann/json.hpp>

namespace moe {
namespace {

using nlohmann::json;

json ToJson(const SamplingParams& s) {
  return {{"temperature", s.temperature},
          {"top_p", s.top_p},
          {"top_k", s.top_k},
          {"min_p", s.min_p},
          {"repetition_penalty", s.repetition_penalty},
          {"presence_penalty", s.presence_penalty},
          {"frequency_penalty", s.frequency_penalty},
          {"seed", s.seed}};
}

SamplingParams SamplingFromJson(const json& j) {
  SamplingParams s;
  s.temperature = j.at("temperature").get<double>();
  s.top_p = j.at("top_p").get<double>();
  s.top_k = j.at("top_k").get<int64_t>();
  s.min_p = j.at("min_p").get<double>();
  s.repetition_penalty = j.at("repetition_penalty").get<double>();
  s.presence_penalty = j.at("presence_penalty").get<double>();
  s.frequency_penalty = j.at("frequency_penalty").get<double>();
  s.seed = j.at("seed").get<uint64_t>();
  return s;
}

json ToJson(const EngineRequest& r) {
  json j = {{"id", r.id},
            {"prompt", r.prompt},
            {"max_tokens", r.max_tokens},
            {"min_tokens", r.min_tokens},
            {"sampling", ToJson(r.sampling)},
            {"logprobs", r.logprobs},
            {"ignore_eos", r.ignore_eos},
            {"stop_token_ids", r.stop_token_ids},
            {"priority", r.priority}};
  if (r.eos_id) j["eos_id"] = *r.eos_id;
  return j;
}

EngineRequest RequestFromJson(const json& j) {
  EngineRequest r;
  r.id = j.at("id").get<RequestId>();
  r.prompt = j.at("prompt").get<std::vector<int32_t>>();
  r.max_tokens = j.at("max_tokens").get<int64_t>();
  r.min_tokens = j.at("min_tokens").get<int64_t>();
  r.sampling = SamplingFromJson(j.at("sampling"));
  r.logprobs = j.at("logprobs").get<int64_t>();
  r.ignore_eos = j.at("ignore_eos").get<bool>();
  r.stop_token_ids = j.at("stop_token_ids").get<std::vector<int32_t>>();
  r.priority = j.at("priority").get<int32_t>();
  if (j.contains("eos_id")) r.eos_id = j.at("eos_id").get<int32_t>();
  return r;
}

// Log-probs travel as parallel arrays per position: fewer map keys than objects per entry.
json ToJson(const RequestOutput& o) {
  json logprobs = json::array();
  for (const auto& position : o.new_logprobs) {
    json ids = json::array(), values = json::array();
    for (const TokenLogprob& t : position) {
      ids.push_back(t.id);
      values.push_back(t.logprob);
    }
    logprobs.push_back({ids, values});
  }
  return {{"id", o.id},
          {"tokens", o.new_token_ids},
          {"logprobs", std::move(logprobs)},
          {"finished", o.finished},
          {"finish_reason", o.finish_reason},
          {"prompt_tokens", o.num_prompt_tokens},
          {"cached_tokens", o.num_cached_tokens}};
}

RequestOutput OutputFromJson(const json& j) {
  RequestOutput o;
  o.id = j.at("id").get<RequestId>();
  o.new_token_ids = j.at("tokens").get<std::vector<int32_t>>();
  for (const json& position : j.at("logprobs")) {
    const auto ids = position.at(0).get<std::vector<int32_t>>();
    const auto values = position.at(1).get<std::vector<double>>();
    if (ids.size() != values.size()) throw std::invalid_argument("logprobs: ids and values differ in length");
    auto& entries = o.new_logprobs.emplace_back();
    for (size_t i = 0; i < ids.size(); ++i) entries.push_back({ids[i], values[i]});
  }
  o.finished = j.at("finished").get<bool>();
  o.finish_reason = j.at("finish_reason").get<std::string>();
  o.num_prompt_tokens = j.at("prompt_tokens").get<int64_t>();
  o.num_cached_tokens = j.at("cached_tokens").get<int64_t>();
  return o;
}

json ToJson(const ToEngine& message) {
  return std::visit(
      [](const auto& m) -> json {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, HelloMessage>) {
          return {{"type", "hello"}, {"client", m.client}};
        } else if constexpr (std::is_same_v<T, SubmitMessage>) {
          return {{"type", "submit"}, {"client", m.client}, {"request", ToJson(m.request)}};
        } else if constexpr (std::is_same_v<T, AbortMessage>) {
          return {{"type", "abort"}, {"ids", m.ids}};
        } else {
          return {{"type", "metrics"}, {"client", m.client}, {"query_id", m.query_id}};
        }
      },
      message);
}

json ToJson(const FromEngine& message) {
  return std::visit(
      [](const auto& m) -> json {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, EngineInfo>) {
          return {{"type", "info"},
                  {"model", m.model},
                  {"max_model_len", m.max_model_len},
                  {"vocab_size", m.vocab_size},
                  {"kv_capacity_tokens", m.kv_capacity_tokens}};
        } else if constexpr (std::is_same_v<T, StepMessage>) {
          json outputs = json::array(), errors = json::array();
          for (const RequestOutput& o : m.outputs) outputs.push_back(ToJson(o));
          for (const RequestError& e : m.errors) {
            errors.push_back({{"id", e.id}, {"status", e.status}, {"message", e.message}});
          }
          return {{"type", "step"},
                  {"outputs", std::move(outputs)},
                  {"errors", std::move(errors)},
                  {"load", {m.load.num_running, m.load.num_waiting, m.load.kv_cache_usage, m.load.num_tokens}}};
        } else {
          return {{"type", "metrics"}, {"query_id", m.query_id}, {"text", m.text}};
        }
      },
      message);
}

std::string ToMsgpack(const json& j) {
  const std::vector<uint8_t> bytes = json::to_msgpack(j);
  return std::string(bytes.begin(), bytes.end());
}

template <typename Message, typename Build>
Expected<Message> Decode(std::string_view bytes, const char* direction, Build build) {
  try {
    const json j = json::from_msgpack(bytes.begin(), bytes.end());
    return build(j, j.at("type").get<std::string>());
  } catch (const std::exception& e) {
    return Status::Error(std::string("malformed ") + direction + " message: " + e.what());
  }
}

}  // namespace

std::string Encode(const ToEngine& message) { return ToMsgpack(ToJson(message)); }
std::string Encode(const FromEngine& message) { return ToMsgpack(ToJson(message)); }

Expected<ToEngine> DecodeToEngine(std::string_view bytes) {
  return Decode<ToEngine>(bytes, "engine-bound", [](const json& j, const std::string& type) -> Expected<ToEngine> {
    if (type == "hello") return ToEngine(HelloMessage{j.at("client").get<std::string>()});
    if (type == "submit") {
      return ToEngine(SubmitMessage{j.at("client").get<std::string>(), RequestFromJson(j.at("request"))});
    }
    if (type == "abort") return ToEngine(AbortMessage{j.at("ids").get<std::vector<RequestId>>()});
    if (type == "metrics") {
      return ToEngine(MetricsQuery{j.at("client").get<std::string>(), j.at("query_id").get<uint64_t>()});
    }
    return Status::Error("unknown engine-bound message type '" + type + "'");
  });
}

Expected<FromEngine> DecodeFromEngine(std::string_view bytes) {
  return Decode<FromEngine>(bytes, "engine", [](const json& j, const std::string& type) -> Expected<FromEngine> {
    if (type == "info") {
      return FromEngine(EngineInfo{j.at("model").get<std::string>(), j.at("max_model_len").get<int64_t>(),
                                   j.at("vocab_size").get<int32_t>(), j.at("kv_capacity_tokens").get<int64_t>()});
    }
    if (type == "step") {
      StepMessage step;
      for (const json& o : j.at("outputs")) step.outputs.push_back(OutputFromJson(o));
      for (const json& e : j.at("errors")) {
        step.errors.push_back(
            {e.at("id").get<RequestId>(), e.at("status").get<int>(), e.at("message").get<std::string>()});
      }
      const json& load = j.at("load");
      step.load = {load.at(0).get<int64_t>(), load.at(1).get<int64_t>(), load.at(2).get<double>(),
                   load.at(3).get<int64_t>()};
      return FromEngine(std::move(step));
    }
    if (type == "metrics") {
      return FromEngine(MetricsReply{j.at("query_id").get<uint64_t>(), j.at("text").get<std::string>()});
    }
    return Status::Error("unknown engine message type '" + type + "'");
  });
}

}  // namespace moe
