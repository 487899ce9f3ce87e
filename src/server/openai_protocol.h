// The OpenAI wire protocol of /v1/completions, /v1/chat/completions and /v1/models, without any
// networking: request bodies are validated into GenerationRequest (or an ApiError in OpenAI's
// error shape), and results are turned into response bodies and SSE events. Every string that
// leaves this file is valid UTF-8 JSON: invalid bytes in token texts become U+FFFD.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace moe {

// ---- Errors ----

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the offending field, e.g. "messages[0].content"; empty: null
  std::string code;   // OpenAI's machine-readable code, e.g. "model_not_found"; empty: null
};

// {"error":{"message":...,"type":...,"param":...|null,"code":...|null}}
std::string ErrorJson(const ApiError& error);

ApiError InvalidRequestError(std::string message, std::string param = "");  // 400
ApiError ModelNotFoundError(std::string_view model);                        // 404 model_not_found
ApiError NotFoundError(std::string message);                                // 404, e.g. an unknown path
ApiError AuthenticationError();                                             // 401 invalid_api_key
ApiError RequestTooLargeError(int64_t body_bytes, int64_t limit_bytes);     // 413
ApiError RateLimitError(std::string message);                               // 429; caller adds Retry-After
ApiError ServiceUnavailableError(std::string message);                      // 503
ApiError InternalServerError(std::string message);                          // 500

// ---- Requests ----

struct ParseLimits {
  std::string served_model;  // the only model name accepted; an absent "model" means this one
  int64_t max_n = 16;
  int64_t max_logprobs = 20;
};

// Everything the API server needs from a completions or chat body. Fields the caller must still
// check against the model (prompt length vs the context, token ids vs the vocabulary) are left to
// it: this layer knows no tokenizer or model.
struct GenerationRequest {
  bool chat = false;
  std::string model;  // as requested, or ParseLimits::served_model when absent
  // Chat: system/user/assistant turns ("developer" is read as "system"); text parts of an array
  // content are joined with "\n", as vLLM does.
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;  // chat, vLLM's extension
  // Completions: the text, or token ids (non-empty). A one-element array ["text"] or [[ids]] is the
  // same as its element; several prompts in one request are refused (400), send one per request.
  std::variant<std::string, std::vector<int32_t>> prompt;

  // Unset: generate until the context is full (chat's default; completions default to 16, as
  // OpenAI, and an explicit null there means unset, as vLLM).
  std::optional<int64_t> max_tokens;
  int64_t min_tokens = 0;
  int64_t n = 1;
  std::vector<std::string> stop;  // at most 4, none empty
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // Unset: the caller picks a random seed (sampling.seed is then 0). With n > 1 each choice needs
  // its own stream of random numbers, e.g. seed + choice index, or the choices come out identical.
  std::optional<uint64_t> seed;
  SamplingParams sampling;  // temperature, top_p, top_k (-1 read as 0 = off), min_p, penalties, seed

  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage; only allowed with stream
  // Completions' "logprobs": k sets logprobs with k alternatives (k = 0: the sampled token's only);
  // chat's "logprobs": true with "top_logprobs": k.
  bool logprobs = false;
  int64_t top_logprobs = 0;
};

// Unknown fields are ignored, as OpenAI does; "echo": true, "best_of" > 1, "suffix", a non-empty
// "logit_bias", "tools" and a non-text "response_format" are refused (400) rather than ignored,
// because ignoring them would silently return something else than asked.
std::variant<GenerationRequest, ApiError> ParseCompletionRequest(std::string_view body, const ParseLimits& limits);
std::variant<GenerationRequest, ApiError> ParseChatRequest(std::string_view body, const ParseLimits& limits);

// ---- Responses ----

// Token texts are raw bytes: a token may hold part of a UTF-8 character. Chat's "bytes" shows them
// exactly; "token" strings show invalid bytes as U+FFFD.
struct TopLogprobEntry {
  int32_t id = 0;
  std::string token;
  double logprob = 0.0;  // -inf and NaN are written as -9999.0, as vLLM does
};
struct LogprobEntry {  // one generated token
  int32_t id = 0;
  std::string token;
  double logprob = 0.0;
  std::vector<TopLogprobEntry> top;  // most likely first
};

struct ResponseMeta {
  bool chat = false;
  std::string id;  // "cmpl-<hex>" / "chatcmpl-<hex>"
  int64_t created = 0;
  std::string model;
  bool logprobs = false;       // choices carry a logprobs object, else "logprobs": null
  bool include_usage = false;  // stream: every chunk but the usage one has "usage": null
};
std::string NewResponseId(bool chat);  // 32 random hex digits after the prefix
int64_t UnixSeconds();
// A fresh id, now, and the request's endpoint, model, logprobs and include_usage.
ResponseMeta MakeResponseMeta(const GenerationRequest& request);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // summed over the choices
  std::optional<int64_t> cached_tokens;  // written as prompt_tokens_details.cached_tokens when set
};

struct ChoiceResult {  // one finished choice of a non-stream response
  int64_t index = 0;
  std::string text;           // after stop-string truncation
  std::string finish_reason;  // "stop", "length", ...; empty: null
  std::vector<LogprobEntry> logprobs;
};

// "text_completion" with choices[].text, or "chat.completion" with choices[].message.
std::string CompletionResponseJson(const ResponseMeta& meta, std::span<const ChoiceResult> choices,
                                   const Usage& usage);

struct ChunkDelta {  // what one stream chunk says about one choice
  int64_t index = 0;
  bool first = false;  // chat: delta carries "role": "assistant"
  std::string text;
  std::vector<LogprobEntry> logprobs;
  // Completions: text_offset of this chunk's first token within the choice's text, in code points
  // (the sum of the lengths of the texts sent before for this choice).
  int64_t text_offset = 0;
  std::string finish_reason;  // set on the choice's last chunk
};

// One "text_completion" / "chat.completion.chunk" object with a single choice. A chat delta holds
// "content" unless this is a final chunk without text, whose delta is {} as OpenAI sends.
std::string StreamChunkJson(const ResponseMeta& meta, const ChunkDelta& delta);
// The closing chunk of include_usage: "choices": [] and the usage.
std::string UsageChunkJson(const ResponseMeta& meta, const Usage& usage);

std::string SseEvent(std::string_view json);  // "data: <json>\n\n"
std::string SseDone();                         // "data: [DONE]\n\n"

struct ModelInfo {
  std::string id;
  int64_t created = 0;
  std::string owned_by = "moe-serve";
  int64_t max_model_len = 0;  // written when > 0, as vLLM does
};
std::string ModelJson(const ModelInfo& model);  // GET /v1/models/{id}
std::string ModelListJson(std::span<const ModelInfo> models);  // GET /v1/models

}  // namespace moe
