#include "server/openai_protocol.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <utility>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace moe {
namespace {

using json = nlohmann::json;

// Token texts and parser messages may hold invalid UTF-8; nlohmann's default dump would throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// ---- Errors ----

ApiError MakeError(int status, std::string type, std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

// ---- Request validation ----

// Thrown by the field readers below and caught in Parse: validation is a long chain of checks that
// each end the parse, and an exception keeps every check one line. It never leaves this file.
struct Failure {
  ApiError error;
};

[[noreturn]] void Fail(std::string message, std::string param) {
  throw Failure{InvalidRequestError(std::move(message), std::move(param))};
}

std::string TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

[[noreturn]] void FailType(const std::string& param, const char* expected, const json& v) {
  Fail("Invalid type for '" + param + "': expected " + expected + ", but got " + TypeName(v) + " instead.", param);
}

// A field's value, or nullptr when it is absent or null: OpenAI treats null as "use the default".
const json* Find(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> GetBool(const json& obj, const char* key) {
  const json* v = Find(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) FailType(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<double> GetNumber(const json& obj, const char* key) {
  const json* v = Find(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) FailType(key, "a number", *v);
  return v->get<double>();
}

std::optional<std::string> GetString(const json& obj, const char* key) {
  const json* v = Find(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) FailType(key, "a string", *v);
  return v->get<std::string>();
}

// Integers; a float with an integral value (16.0) is accepted as clients built on floats send them.
int64_t ToInt(const json& v, const std::string& param) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Fail("Invalid value for '" + param + "': " + Dump(v) + " is too large.", param);
    }
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    // 2^63 is the first double above the int64 range.
    if (d == std::floor(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
      return static_cast<int64_t>(d);
    }
  }
  FailType(param, "an integer", v);
}

std::optional<int64_t> GetInt(const json& obj, const char* key) {
  const json* v = Find(obj, key);
  if (!v) return std::nullopt;
  return ToInt(*v, key);
}

void CheckAtLeast(const char* param, int64_t value, int64_t min) {
  if (value < min) {
    Fail("'" + std::string(param) + "' must be at least " + std::to_string(min) + ", got " + std::to_string(value),
         param);
  }
}

void CheckBetween(const char* param, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max) {
    Fail("'" + std::string(param) + "' must be between " + std::to_string(min) + " and " + std::to_string(max) +
             ", got " + std::to_string(value),
         param);
  }
}

// `low_open`: the lower bound itself is not allowed.
void CheckRange(const char* param, double value, double min, double max, bool low_open) {
  bool ok = (low_open ? value > min : value >= min) && value <= max;
  if (!ok) {
    Fail("'" + std::string(param) + "' must be " + (low_open ? "greater than " : "between ") + Dump(json(min)) +
             (low_open ? " and at most " : " and ") + Dump(json(max)) + ", got " + Dump(json(value)),
         param);
  }
}

void ParseModel(const json& body, const ParseLimits& limits, GenerationRequest& r) {
  std::optional<std::string> model = GetString(body, "model");
  if (model && *model != limits.served_model) throw Failure{ModelNotFoundError(*model)};
  r.model = limits.served_model;
}

void ParseStop(const json& body, GenerationRequest& r) {
  const json* stop = Find(body, "stop");
  if (!stop) return;
  if (stop->is_string()) {
    r.stop.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    if (stop->size() > 4) {
      Fail("Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with length " +
               std::to_string(stop->size()) + " instead.",
           "stop");
    }
    for (size_t i = 0; i < stop->size(); ++i) {
      const json& s = (*stop)[i];
      if (!s.is_string()) FailType("stop[" + std::to_string(i) + "]", "a string", s);
      r.stop.push_back(s.get<std::string>());
    }
  } else {
    FailType("stop", "a string or an array of strings", *stop);
  }
  for (const std::string& s : r.stop) {
    // An empty stop string would match before the first token.
    if (s.empty()) Fail("Invalid 'stop': stop strings must not be empty.", "stop");
  }
}

int32_t ToTokenId(const json& v, const std::string& param) {
  if (!v.is_number_integer()) FailType(param, "an integer token id", v);
  int64_t id = ToInt(v, param);
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
    Fail("Invalid '" + param + "': token ids must be between 0 and 2147483647, got " + Dump(v), param);
  }
  return static_cast<int32_t>(id);
}

std::vector<int32_t> ParseTokenIds(const json& arr, const std::string& param) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) ids.push_back(ToTokenId(arr[i], param + "[" + std::to_string(i) + "]"));
  return ids;
}

void ParseSampling(const json& body, GenerationRequest& r) {
  SamplingParams& s = r.sampling;
  if (auto v = GetNumber(body, "temperature")) {
    CheckRange("temperature", *v, 0.0, 2.0, false);
    s.temperature = *v;
  }
  if (auto v = GetNumber(body, "top_p")) {
    CheckRange("top_p", *v, 0.0, 1.0, true);
    s.top_p = *v;
  }
  if (auto v = GetInt(body, "top_k")) {
    if (*v < -1) Fail("'top_k' must be -1 or 0 (no limit) or at least 1, got " + std::to_string(*v), "top_k");
    s.top_k = *v < 0 ? 0 : *v;
  }
  if (auto v = GetNumber(body, "min_p")) {
    CheckRange("min_p", *v, 0.0, 1.0, false);
    s.min_p = *v;
  }
  if (auto v = GetNumber(body, "presence_penalty")) {
    CheckRange("presence_penalty", *v, -2.0, 2.0, false);
    s.presence_penalty = *v;
  }
  if (auto v = GetNumber(body, "frequency_penalty")) {
    CheckRange("frequency_penalty", *v, -2.0, 2.0, false);
    s.frequency_penalty = *v;
  }
  if (auto v = GetNumber(body, "repetition_penalty")) {
    if (!(*v > 0.0)) Fail("'repetition_penalty' must be greater than 0, got " + Dump(json(*v)), "repetition_penalty");
    s.repetition_penalty = *v;
  }
  if (const json* seed = Find(body, "seed")) {
    // Any 64-bit pattern is a fine seed, so negative ones are taken as their two's complement.
    if (seed->is_number_unsigned()) {
      r.seed = seed->get<uint64_t>();
    } else {
      r.seed = static_cast<uint64_t>(ToInt(*seed, "seed"));
    }
    s.seed = *r.seed;
  }
}

void ParseCommon(const json& body, const ParseLimits& limits, GenerationRequest& r) {
  ParseModel(body, limits, r);
  if (auto n = GetInt(body, "n")) {
    CheckBetween("n", *n, 1, limits.max_n);
    r.n = *n;
  }
  ParseStop(body, r);
  if (const json* ids = Find(body, "stop_token_ids")) {
    if (!ids->is_array()) FailType("stop_token_ids", "an array of integers", *ids);
    r.stop_token_ids = ParseTokenIds(*ids, "stop_token_ids");
  }
  r.ignore_eos = GetBool(body, "ignore_eos").value_or(false);
  ParseSampling(body, r);

  r.stream = GetBool(body, "stream").value_or(false);
  if (const json* opts = Find(body, "stream_options")) {
    if (!r.stream) {
      Fail("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options");
    }
    if (!opts->is_object()) FailType("stream_options", "an object", *opts);
    if (const json* u = Find(*opts, "include_usage")) {
      if (!u->is_boolean()) FailType("stream_options.include_usage", "a boolean", *u);
      r.include_usage = u->get<bool>();
    }
  }

  if (const json* bias = Find(body, "logit_bias")) {
    if (!bias->is_object()) FailType("logit_bias", "an object", *bias);
    if (!bias->empty()) Fail("'logit_bias' is not supported.", "logit_bias");
  }
  if (const json* format = Find(body, "response_format")) {
    if (!format->is_object()) FailType("response_format", "an object", *format);
    const json* type = Find(*format, "type");
    if (type && *type != "text") {
      Fail("Invalid 'response_format.type': only 'text' is supported, got " + Dump(*type) + ".",
           "response_format.type");
    }
  }
}

void ParseMinTokens(const json& body, GenerationRequest& r) {
  if (auto v = GetInt(body, "min_tokens")) {
    CheckAtLeast("min_tokens", *v, 0);
    if (r.max_tokens && *v > *r.max_tokens) {
      Fail("'min_tokens' must be at most 'max_tokens' (" + std::to_string(*r.max_tokens) + "), got " +
               std::to_string(*v),
           "min_tokens");
    }
    r.min_tokens = *v;
  }
}

void ParsePrompt(const json& body, GenerationRequest& r) {
  const json* prompt = Find(body, "prompt");
  if (!prompt) Fail("Missing required parameter: 'prompt'.", "prompt");
  if (prompt->is_string()) {
    r.prompt = prompt->get<std::string>();
    return;
  }
  if (!prompt->is_array()) FailType("prompt", "a string or an array of token ids", *prompt);
  if (prompt->empty()) {
    Fail("Invalid 'prompt': empty array. Expected a string or a non-empty array of token ids.", "prompt");
  }
  const json& first = (*prompt)[0];
  if (first.is_number()) {
    r.prompt = ParseTokenIds(*prompt, "prompt");
    return;
  }
  if (!first.is_string() && !first.is_array()) FailType("prompt[0]", "a string, an integer or an array", first);
  if (prompt->size() > 1) {
    Fail("Batched prompts are not supported: 'prompt' holds " + std::to_string(prompt->size()) +
             " prompts; send one request per prompt.",
         "prompt");
  }
  if (first.is_string()) {
    r.prompt = first.get<std::string>();
    return;
  }
  if (first.empty()) Fail("Invalid 'prompt[0]': empty array. Expected a non-empty array of token ids.", "prompt[0]");
  r.prompt = ParseTokenIds(first, "prompt[0]");
}

std::string ParseContent(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) FailType(param, "a string or an array of content parts", content);
  if (content.empty()) {
    Fail("Invalid '" + param +
             "': empty array. Expected an array with minimum length 1, but got an empty array instead.",
         param);
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    std::string part_param = param + "[" + std::to_string(i) + "]";
    if (!part.is_object()) FailType(part_param, "an object", part);
    const json* type = Find(part, "type");
    if (!type) Fail("Missing required parameter: '" + part_param + ".type'.", part_param + ".type");
    if (!type->is_string()) FailType(part_param + ".type", "a string", *type);
    if (*type != "text") {
      Fail("Unsupported content part type " + Dump(*type) + " in '" + part_param +
               "': only 'text' parts are supported.",
           part_param + ".type");
    }
    const json* part_text = Find(part, "text");
    if (!part_text) Fail("Missing required parameter: '" + part_param + ".text'.", part_param + ".text");
    if (!part_text->is_string()) FailType(part_param + ".text", "a string", *part_text);
    if (i > 0) text += '\n';
    text += part_text->get<std::string>();
  }
  return text;
}

void ParseMessages(const json& body, GenerationRequest& r) {
  const json* messages = Find(body, "messages");
  if (!messages) Fail("Missing required parameter: 'messages'.", "messages");
  if (!messages->is_array()) FailType("messages", "an array", *messages);
  if (messages->empty()) {
    Fail("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
         "messages");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) FailType(param, "an object", m);
    const json* role = Find(m, "role");
    if (!role) Fail("Missing required parameter: '" + param + ".role'.", param + ".role");
    if (!role->is_string()) FailType(param + ".role", "a string", *role);
    std::string role_name = role->get<std::string>();
    if (role_name == "developer") role_name = "system";  // OpenAI's newer name for system
    if (role_name != "system" && role_name != "user" && role_name != "assistant") {
      Fail("Invalid value for '" + param + ".role': " + Dump(*role) +
               " is not supported. Supported values are: 'system', 'developer', 'user' and 'assistant'.",
           param + ".role");
    }
    const json* content = Find(m, "content");
    if (!content) Fail("Missing required parameter: '" + param + ".content'.", param + ".content");
    r.messages.push_back(ChatMessage{role_name, ParseContent(*content, param + ".content")});
  }
}

void ParseCompletionFields(const json& body, const ParseLimits& limits, GenerationRequest& r) {
  ParsePrompt(body, r);
  auto max_tokens = body.find("max_tokens");
  if (max_tokens == body.end()) {
    r.max_tokens = 16;
  } else if (!max_tokens->is_null()) {
    r.max_tokens = ToInt(*max_tokens, "max_tokens");
    CheckAtLeast("max_tokens", *r.max_tokens, 1);
  }
  ParseMinTokens(body, r);
  if (auto k = GetInt(body, "logprobs")) {
    CheckBetween("logprobs", *k, 0, limits.max_logprobs);
    r.logprobs = true;
    r.top_logprobs = *k;
  }
  if (GetBool(body, "echo").value_or(false)) Fail("'echo' is not supported.", "echo");
  if (auto best_of = GetInt(body, "best_of")) {
    CheckAtLeast("best_of", *best_of, 1);
    if (*best_of > 1) Fail("'best_of' greater than 1 is not supported; use 'n' for several choices.", "best_of");
  }
  if (auto suffix = GetString(body, "suffix"); suffix && !suffix->empty()) {
    Fail("'suffix' is not supported.", "suffix");
  }
}

void ParseChatFields(const json& body, const ParseLimits& limits, GenerationRequest& r) {
  ParseMessages(body, r);
  // max_completion_tokens replaced max_tokens in OpenAI's chat API; both are honoured, the new
  // name first.
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    if (auto v = GetInt(body, key)) {
      CheckAtLeast(key, *v, 1);
      if (!r.max_tokens) r.max_tokens = *v;
    }
  }
  ParseMinTokens(body, r);
  r.logprobs = GetBool(body, "logprobs").value_or(false);
  if (auto k = GetInt(body, "top_logprobs")) {
    CheckBetween("top_logprobs", *k, 0, limits.max_logprobs);
    if (*k > 0 && !r.logprobs) Fail("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs");
    r.top_logprobs = *k;
  }
  r.add_generation_prompt = GetBool(body, "add_generation_prompt").value_or(true);
  if (const json* tools = Find(body, "tools")) {
    if (!tools->is_array()) FailType("tools", "an array", *tools);
    if (!tools->empty()) Fail("'tools' are not supported.", "tools");
  }
  if (const json* functions = Find(body, "functions")) {
    if (!functions->is_array()) FailType("functions", "an array", *functions);
    if (!functions->empty()) Fail("'functions' are not supported.", "functions");
  }
}

std::variant<GenerationRequest, ApiError> Parse(std::string_view body, const ParseLimits& limits, bool chat) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    // what() is "[json.exception.parse_error.101] parse error at line 1, column 9: ..."; the tag
    // means nothing to a client, the position does.
    std::string what = e.what();
    size_t tag_end = what.find("] ");
    if (tag_end != std::string::npos) what = what.substr(tag_end + 2);
    return InvalidRequestError("Invalid JSON body: " + what);
  }
  if (!j.is_object()) return InvalidRequestError("The request body must be a JSON object, got " + TypeName(j) + ".");
  GenerationRequest r;
  r.chat = chat;
  try {
    ParseCommon(j, limits, r);
    if (chat) {
      ParseChatFields(j, limits, r);
    } else {
      ParseCompletionFields(j, limits, r);
    }
  } catch (const Failure& f) {
    return f.error;
  } catch (const json::exception& e) {  // a type check missed above: still the client's input
    return InvalidRequestError(std::string("Invalid request: ") + e.what());
  }
  return r;
}

// ---- Responses ----

json Logprob(double lp) { return std::isfinite(lp) ? lp : -9999.0; }

// OpenAI's text_offset counts characters; counting the bytes that start one stays right when a
// character is split across tokens.
int64_t CodePoints(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

json Bytes(std::string_view s) {
  json bytes = json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

json CompletionLogprobs(std::span<const LogprobEntry> entries, int64_t text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  for (const LogprobEntry& e : entries) {
    std::string token = utf8::Sanitize(e.token);
    tokens.push_back(token);
    token_logprobs.push_back(Logprob(e.logprob));
    // A dict keyed by text: two ids with the same (sanitized) text keep the first, most likely.
    // The sampled token is always in it, as vLLM does, so logprobs = 0 still shows it.
    json top = json::object();
    for (const TopLogprobEntry& t : e.top) {
      std::string key = utf8::Sanitize(t.token);
      if (!top.contains(key)) top[key] = Logprob(t.logprob);
    }
    if (!top.contains(token)) top[token] = Logprob(e.logprob);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += CodePoints(e.token);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
          {"text_offset", offsets}};
}

json ChatLogprobs(std::span<const LogprobEntry> entries) {
  json content = json::array();
  for (const LogprobEntry& e : entries) {
    json top = json::array();
    for (const TopLogprobEntry& t : e.top) {
      top.push_back({{"token", utf8::Sanitize(t.token)}, {"logprob", Logprob(t.logprob)}, {"bytes", Bytes(t.token)}});
    }
    content.push_back({{"token", utf8::Sanitize(e.token)},
                       {"logprob", Logprob(e.logprob)},
                       {"bytes", Bytes(e.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

json UsageObject(const Usage& usage) {
  json u = {{"prompt_tokens", usage.prompt_tokens},
            {"completion_tokens", usage.completion_tokens},
            {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
  if (usage.cached_tokens) u["prompt_tokens_details"] = {{"cached_tokens", *usage.cached_tokens}};
  return u;
}

json FinishReason(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }

json Envelope(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

}  // namespace

std::string ErrorJson(const ApiError& error) {
  json e = {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
  return Dump(json{{"error", std::move(e)}});
}

ApiError InvalidRequestError(std::string message, std::string param) {
  return MakeError(400, "invalid_request_error", std::move(message), std::move(param), "");
}

ApiError ModelNotFoundError(std::string_view model) {
  return MakeError(404, "invalid_request_error", "The model `" + std::string(model) + "` does not exist.", "model",
                   "model_not_found");
}

ApiError NotFoundError(std::string message) {
  return MakeError(404, "invalid_request_error", std::move(message), "", "not_found");
}

ApiError AuthenticationError() {
  return MakeError(401, "invalid_request_error",
                   "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'.", "", "invalid_api_key");
}

ApiError RequestTooLargeError(int64_t body_bytes, int64_t limit_bytes) {
  return MakeError(413, "invalid_request_error",
                   "The request body of " + std::to_string(body_bytes) + " bytes exceeds the limit of " +
                       std::to_string(limit_bytes) + " bytes.",
                   "", "request_too_large");
}

ApiError RateLimitError(std::string message) {
  return MakeError(429, "rate_limit_error", std::move(message), "", "rate_limit_exceeded");
}

ApiError ServiceUnavailableError(std::string message) {
  return MakeError(503, "service_unavailable_error", std::move(message), "", "service_unavailable");
}

ApiError InternalServerError(std::string message) {
  return MakeError(500, "server_error", std::move(message), "", "internal_error");
}

std::variant<GenerationRequest, ApiError> ParseCompletionRequest(std::string_view body, const ParseLimits& limits) {
  return Parse(body, limits, false);
}

std::variant<GenerationRequest, ApiError> ParseChatRequest(std::string_view body, const ParseLimits& limits) {
  return Parse(body, limits, true);
}

std::string NewResponseId(bool chat) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return std::string(chat ? "chatcmpl-" : "cmpl-") + hex;
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ResponseMeta MakeResponseMeta(const GenerationRequest& request) {
  ResponseMeta meta;
  meta.chat = request.chat;
  meta.id = NewResponseId(request.chat);
  meta.created = UnixSeconds();
  meta.model = request.model;
  meta.logprobs = request.logprobs;
  meta.include_usage = request.stream && request.include_usage;
  return meta;
}

std::string CompletionResponseJson(const ResponseMeta& meta, std::span<const ChoiceResult> choices,
                                   const Usage& usage) {
  json out = Envelope(meta, meta.chat ? "chat.completion" : "text_completion");
  json list = json::array();
  for (const ChoiceResult& c : choices) {
    json choice = {{"index", c.index}};
    if (meta.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", utf8::Sanitize(c.text)}};
      choice["logprobs"] = meta.logprobs ? ChatLogprobs(c.logprobs) : json(nullptr);
    } else {
      choice["text"] = utf8::Sanitize(c.text);
      choice["logprobs"] = meta.logprobs ? CompletionLogprobs(c.logprobs, 0) : json(nullptr);
    }
    choice["finish_reason"] = FinishReason(c.finish_reason);
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = UsageObject(usage);
  return Dump(out);
}

std::string StreamChunkJson(const ResponseMeta& meta, const ChunkDelta& delta) {
  json out = Envelope(meta, meta.chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", delta.index}};
  bool has_logprobs = meta.logprobs && !delta.logprobs.empty();
  if (meta.chat) {
    json d = json::object();
    if (delta.first) d["role"] = "assistant";
    if (delta.first || !delta.text.empty() || delta.finish_reason.empty()) d["content"] = utf8::Sanitize(delta.text);
    choice["delta"] = std::move(d);
    choice["logprobs"] = has_logprobs ? ChatLogprobs(delta.logprobs) : json(nullptr);
  } else {
    choice["text"] = utf8::Sanitize(delta.text);
    choice["logprobs"] = has_logprobs ? CompletionLogprobs(delta.logprobs, delta.text_offset) : json(nullptr);
  }
  choice["finish_reason"] = FinishReason(delta.finish_reason);
  out["choices"] = json::array({std::move(choice)});
  if (meta.include_usage) out["usage"] = nullptr;
  return Dump(out);
}

std::string UsageChunkJson(const ResponseMeta& meta, const Usage& usage) {
  json out = Envelope(meta, meta.chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = UsageObject(usage);
  return Dump(out);
}

std::string SseEvent(std::string_view json_text) {
  std::string out;
  out.reserve(json_text.size() + 8);
  out += "data: ";
  out += json_text;
  out += "\n\n";
  return out;
}

std::string SseDone() { return "data: [DONE]\n\n"; }

namespace {
json ModelObject(const ModelInfo& model) {
  json m = {{"id", model.id},
            {"object", "model"},
            {"created", model.created},
            {"owned_by", model.owned_by},
            {"root", model.id},
            {"parent", nullptr}};
  if (model.max_model_len > 0) m["max_model_len"] = model.max_model_len;
  return m;
}
}  // namespace

std::string ModelJson(const ModelInfo& model) { return Dump(ModelObject(model)); }

std::string ModelListJson(std::span<const ModelInfo> models) {
  json data = json::array();
  for (const ModelInfo& m : models) data.push_back(ModelObject(m));
  return Dump(json{{"object", "list"}, {"data", std::move(data)}});
}

}  // namespace moe
