#include "apps/completions_client.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// httplib's names for its errors are single words ("Connection", "Read").
std::string Describe(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection: return "cannot connect";
    case httplib::Error::ConnectionTimeout: return "timed out connecting";
    case httplib::Error::Read: return "reading the response failed or timed out (see --timeout)";
    case httplib::Error::Write: return "sending the request failed";
    case httplib::Error::SSLConnection: return "the TLS handshake failed";
    case httplib::Error::SSLServerVerification: return "the server's TLS certificate did not verify";
    default: return httplib::to_string(error);
  }
}

// The message of an OpenAI-shaped error body ({"error": {"message": ...}}), else the body itself.
std::string ErrorMessage(const std::string& body) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  std::string text = body.substr(0, 300);
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text.empty() ? "(empty body)" : text;
}

// Reads "data:" lines of a server-sent event stream as they arrive, one event per blank line.
class SseParser {
 public:
  template <typename OnEvent>
  void Feed(const char* data, size_t size, OnEvent&& on_event) {
    buffer_.append(data, size);
    size_t start = 0, end;
    while ((end = buffer_.find('\n', start)) != std::string::npos) {
      std::string_view line(buffer_.data() + start, end - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) {
        if (has_data_) on_event(event_);
        event_.clear();
        has_data_ = false;
      } else if (line.rfind("data:", 0) == 0) {
        line.remove_prefix(5);
        if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
        if (has_data_) event_ += '\n';
        event_ += line;
        has_data_ = true;
      }  // comments (":...") and other fields carry nothing a completion needs
      start = end + 1;
    }
    buffer_.erase(0, start);
  }

  template <typename OnEvent>
  void Finish(OnEvent&& on_event) {
    if (has_data_) on_event(event_);
    has_data_ = false;
  }

 private:
  std::string buffer_, event_;
  bool has_data_ = false;
};

}  // namespace

Expected<BaseUrl> ParseBaseUrl(const std::string& url) {
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
  const std::string scheme = url.rfind("https://", 0) == 0 ? "https://" : "http://";
  const char* schemes = "http:// or https://";
#else
  const std::string scheme = "http://";
  const char* schemes = "http:// (this build of cpp-httplib has no TLS)";
#endif
  if (url.rfind(scheme, 0) != 0) return Status::Error("'" + url + "' must start with " + schemes);
  const size_t slash = url.find('/', scheme.size());
  BaseUrl b{url, url.substr(0, slash), slash == std::string::npos ? "" : url.substr(slash)};
  if (b.scheme_host_port.size() == scheme.size()) return Status::Error("'" + url + "' names no host");
  while (!b.prefix.empty() && b.prefix.back() == '/') b.prefix.pop_back();
  // Accept the OpenAI SDK's form too (http://host:port/v1).
  if (b.prefix.size() >= 3 && b.prefix.compare(b.prefix.size() - 3, 3, "/v1") == 0) b.prefix.resize(b.prefix.size() - 3);
  return b;
}

std::unique_ptr<httplib::Client> MakeClient(const BaseUrl& url, const ClientSettings& settings) {
  auto client = std::make_unique<httplib::Client>(url.scheme_host_port);
  client->set_connection_timeout(std::chrono::seconds(10));
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(settings.timeout_s * 1000));
  client->set_read_timeout(timeout);
  client->set_write_timeout(timeout);
  client->set_keep_alive(true);
  // httplib writes the headers and the body separately: with Nagle's algorithm the body would wait
  // for the server's delayed ACK (40 ms on Linux), which lands in every TTFT.
  client->set_tcp_nodelay(true);
  if (!settings.api_key.empty()) client->set_bearer_token_auth(settings.api_key);
  return client;
}

Expected<ServedModel> QueryModel(const BaseUrl& url, const ClientSettings& settings, const std::string& name) {
  auto client = MakeClient(url, settings);
  client->set_read_timeout(std::chrono::seconds(30));
  const std::string path = url.prefix + "/v1/models";
  const httplib::Result res = client->Get(path);
  if (!res) {
    return Status::Error("cannot reach the server at " + url.text + " (GET " + path + ": " +
                         Describe(res.error()) + "); is `moe-serve serve` running there?");
  }
  if (res->status != 200) {
    return Status::Error("GET " + path + " at " + url.text + " answered HTTP " + std::to_string(res->status) + ": " +
                         ErrorMessage(res->body) + (res->status == 401 ? " (see --api-key)" : ""));
  }
  const json j = json::parse(res->body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array()) {
    return Status::Error("GET " + path + ": not a model list: " + ErrorMessage(res->body));
  }
  for (const json& m : j["data"]) {
    if (!m.is_object() || !m.contains("id") || !m["id"].is_string()) continue;
    ServedModel model{m["id"].get<std::string>(), 0};
    if (m.contains("max_model_len") && m["max_model_len"].is_number_integer()) {
      model.max_model_len = m["max_model_len"].get<int64_t>();
    }
    if (name.empty() || name == model.id) return model;
  }
  if (name.empty()) return Status::Error("GET " + path + " lists no model");
  return Status::Error("--model: the server does not serve '" + name + "' (GET " + path + ")");
}

RequestResult SendRequest(httplib::Client& client, const std::string& path, const std::string& model,
                          const RequestSpec& spec) {
  RequestResult r;
  r.prompt_len = static_cast<int64_t>(spec.prompt.size());
  const json body = {{"model", model},
                     {"prompt", spec.prompt},
                     {"max_tokens", spec.output_len},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");

  int status = 0;
  std::string error_body;  // the body of a non-200 answer
  SseParser parser;
  bool done = false;
  int64_t chunks = 0;
  std::optional<int64_t> usage_tokens;
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  auto on_event = [&](const std::string& data) {
    if (!r.error.empty()) return;
    if (data == "[DONE]") {
      done = true;
      return;
    }
    const json j = json::parse(data, nullptr, false);
    if (!j.is_object()) {
      r.error = "malformed stream event: " + data.substr(0, 200);
      return;
    }
    if (j.contains("error")) {
      r.error = "error in the stream: " + ErrorMessage(data);
      return;
    }
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      const Clock::time_point now = Clock::now();
      if (chunks == 0) {
        r.ttft_s = std::chrono::duration<double>(now - start).count();
      } else {
        r.itl_s.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
      ++chunks;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const json& u = j["usage"];
      if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer()) {
        usage_tokens = u["completion_tokens"].get<int64_t>();
      }
    }
  };
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(data, std::min<size_t>(size, 4096));
    } else {
      parser.Feed(data, size, on_event);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(req, res, error);
  if (status == 200) parser.Finish(on_event);

  if (!sent && status == 0) {
    r.error = "request failed: " + Describe(error);
  } else if (status != 200) {
    r.error = "HTTP " + std::to_string(status) + ": " + ErrorMessage(error_body.empty() ? res.body : error_body);
  } else if (!sent) {
    if (r.error.empty()) r.error = "the stream broke off: " + Describe(error);
  } else if (r.error.empty() && !done) {
    r.error = "the stream ended without data: [DONE]";
  } else if (r.error.empty() && chunks == 0) {
    r.error = "the stream held no completion chunk";
  }
  r.success = r.error.empty();
  r.e2el_s = std::chrono::duration<double>(last - start).count();
  r.output_tokens = usage_tokens.value_or(chunks);
  return r;
}

}  // namespace moe
