// A client of an OpenAI-compatible server (`moe-serve serve`, vLLM, SGLang, ...) for bench-serve:
// its base URL, the model it serves, and one streaming /v1/completions request timed chunk by chunk.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <httplib.h>

#include "base/status.h"

namespace moe {

// --base-url split into what httplib::Client takes and the path the API lives under.
struct BaseUrl {
  std::string text;              // as given
  std::string scheme_host_port;  // http://host:port
  std::string prefix;            // "" or "/something", without /v1
};

// Parses --base-url: http:// (or https:// where cpp-httplib has TLS), a host, an optional path
// prefix; a trailing /v1 is dropped, as the OpenAI SDK's form of the same URL.
Expected<BaseUrl> ParseBaseUrl(const std::string& url);

struct ClientSettings {
  std::string api_key;  // sent as a bearer token when set
  double timeout_s = 3600;
};

// A keep-alive client of the server, with Nagle's algorithm off.
std::unique_ptr<httplib::Client> MakeClient(const BaseUrl& url, const ClientSettings& settings);

struct ServedModel {
  std::string id;
  int64_t max_model_len = 0;  // 0: not reported
};

// The served model called `name` (the first of GET /v1/models when empty), or an error naming
// what the server answered.
Expected<ServedModel> QueryModel(const BaseUrl& url, const ClientSettings& settings, const std::string& name);

struct RequestSpec {
  std::vector<int32_t> prompt;
  int64_t output_len = 0;
};

struct RequestResult {
  bool success = false;
  std::string error;
  int64_t prompt_len = 0;
  int64_t output_tokens = 0;  // usage.completion_tokens, else the number of content chunks
  double ttft_s = 0;
  double e2el_s = 0;           // to the last content chunk, as vLLM measures it
  std::vector<double> itl_s;   // gaps between consecutive content chunks
};

// Sends one greedy, ignore_eos completion of spec's token ids over a stream and times it.
RequestResult SendRequest(httplib::Client& client, const std::string& path, const std::string& model,
                          const RequestSpec& spec);

}  // namespace moe
