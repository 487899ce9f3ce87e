#include "server/api_server.h"

#include <sys/socket.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <variant>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "base/termination.h"
#include "server/openai_protocol.h"
#include "server/stop_matcher.h"

namespace moe {
namespace {

using std::chrono::milliseconds;

// How often a waiting handler looks up from its stream: to notice a shutdown or a gone client.
constexpr milliseconds kPoll(100);

// Code points of valid UTF-8: the bytes that do not continue a character.
int64_t Utf8Length(std::string_view text) {
  int64_t n = 0;
  for (unsigned char byte : text) n += (byte & 0xC0) != 0x80;
  return n;
}

void Reply(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  if (error.status == 429) res.set_header("Retry-After", "1");
  res.set_content(ErrorJson(error), "application/json");
}

// One choice of a request: its engine request and the text made of its tokens so far.
struct Choice {
  Choice(int64_t index, RequestId id, const Tokenizer& tokenizer, std::vector<std::string> stops)
      : index(index), id(id), detokenizer(tokenizer), stop(std::move(stops)) {}
  int64_t index;
  RequestId id;
  IncrementalDetokenizer detokenizer;
  StopMatcher stop;
  int64_t num_tokens = 0;
  int64_t code_points = 0;  // of the text sent so far, for completions' text_offset
  bool first = true;
  bool done = false;
};

// A request in flight: its choices, all feeding one stream.
struct Generation {
  GenerationRequest request;
  ResponseMeta meta;
  std::vector<int32_t> prompt;
  std::vector<Choice> choices;
  std::unordered_map<RequestId, size_t> choice_of;
  std::shared_ptr<RequestStream> stream = std::make_shared<RequestStream>();
  std::optional<StreamEvent> first_event;  // read before a stream's status line was sent
  int64_t cached_tokens = 0;

  bool done() const {
    for (const Choice& c : choices) {
      if (!c.done) return false;
    }
    return true;
  }
  Usage usage() const {
    Usage u{static_cast<int64_t>(prompt.size()), 0, cached_tokens};
    for (const Choice& c : choices) u.completion_tokens += c.num_tokens;
    return u;
  }
};

class ApiServer {
 public:
  ApiServer(const Tokenizer& tokenizer, EngineGroup& engine, const ApiServerOptions& options)
      : tokenizer_(tokenizer),
        engine_(engine),
        options_(options),
        limits_{options.served_model, options.max_n, options.max_logprobs} {}

  Status Run() {
    httplib::Server server;
    const int threads = options_.threads;
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server.set_payload_max_length(options_.max_body_bytes);
    // Streamed tokens leave at once rather than waiting on Nagle's algorithm (about 40 ms per
    // burst, measured), and clients keep their connections.
    server.set_tcp_nodelay(true);
    server.set_keep_alive_max_count(1 << 20);
    int listen_fd = -1;
    server.set_socket_options([&listen_fd](socket_t fd) {
      httplib::default_socket_options(fd);  // SO_REUSEADDR and SO_REUSEPORT: API servers share the port
      listen_fd = fd;
    });
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return Authorize(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                 : httplib::Server::HandlerResponse::Handled;
    });
    // Statuses httplib sets itself (404 unknown path, 413 body too large, 400 bad framing) get
    // OpenAI's error shape too.
    server.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                          httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      if (res.status == 413) {
        Reply(res, RequestTooLargeError(std::atoll(req.get_header_value("Content-Length").c_str()),
                                        options_.max_body_bytes));
      } else if (res.status == 404 && !AllowedMethod(req.path).empty()) {
        ApiError error = InvalidRequestError(req.method + " is not allowed on " + req.path + "; use " +
                                             AllowedMethod(req.path));
        error.status = 405;
        error.code = "method_not_allowed";
        Reply(res, error);
        res.set_header("Allow", AllowedMethod(req.path));
      } else if (res.status == 404) {
        Reply(res, NotFoundError("no route for " + req.method + " " + req.path));
      } else {
        ApiError error = InvalidRequestError("malformed HTTP request");
        error.status = res.status;
        Reply(res, error);
      }
      return httplib::Server::HandlerResponse::Handled;
    }));
    server.Get("/health", [this](const httplib::Request&, httplib::Response& res) { Health(res); });
    server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { Models(res); });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { Metrics(res); });
    server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Generate(req, res, /*chat=*/false);
    });
    server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Generate(req, res, /*chat=*/true);
    });

    if (!server.bind_to_port(options_.host, options_.port)) {
      return Status::Error("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                           " (in use, or not an address of this host)");
    }
    // httplib listens with a backlog of 5: under many connecting clients the queue overflows and
    // connects stall for a second. Listening again raises it.
    ::listen(listen_fd, SOMAXCONN);
    spdlog::info("API server listening on http://{}:{}", options_.host, options_.port);
    if (!options_.ready_file.empty()) std::ofstream(options_.ready_file).put('\n');
    std::thread listener([&] { server.listen_after_bind(); });
    while (WaitForTermination(std::chrono::seconds(1)) == 0) {
    }
    // Stop accepting; requests in flight get the grace period to finish, then are aborted.
    spdlog::info("API server shutting down: {} requests in flight", in_flight_.load());
    server.stop();
    const auto deadline = std::chrono::steady_clock::now() + options_.shutdown_grace;
    while (in_flight_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(20));
    }
    shutting_down_ = true;
    listener.join();
    return Status::Ok();
  }

 private:
  bool Authorize(const httplib::Request& req, httplib::Response& res) const {
    if (options_.api_key.empty() || req.path == "/health") return true;
    if (req.get_header_value("Authorization") == "Bearer " + options_.api_key) return true;
    Reply(res, AuthenticationError());
    return false;
  }

  void Health(httplib::Response& res) const {
    if (engine_.info()) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    } else {
      Reply(res, ServiceUnavailableError(engine_.unavailable_reason()));
    }
  }

  void Models(httplib::Response& res) const {
    const auto info = engine_.info();
    const ModelInfo model{options_.served_model, started_, "moe-serve", info ? info->max_model_len : 0};
    res.set_content(ModelListJson(std::span(&model, 1)), "application/json");
  }

  void Metrics(httplib::Response& res) const {
    auto text = engine_.Metrics(std::chrono::seconds(5));
    if (!text.ok()) return Reply(res, ServiceUnavailableError(text.status().message()));
    res.set_content(*text, "text/plain; version=0.0.4");
  }

  // The prompt's token ids, checked against the model; or the error to answer.
  std::variant<std::vector<int32_t>, ApiError> Tokenize(const GenerationRequest& request,
                                                        const EngineInfo& info) const {
    std::vector<int32_t> ids;
    const std::string param = request.chat ? "messages" : "prompt";
    if (request.chat) {
      auto text = tokenizer_.ApplyChatTemplate(request.messages, request.add_generation_prompt);
      if (!text.ok()) return InvalidRequestError(text.status().message(), "messages");
      ids = tokenizer_.Encode(*text, /*add_bos=*/false);
    } else if (const auto* text = std::get_if<std::string>(&request.prompt)) {
      ids = tokenizer_.Encode(*text, tokenizer_.add_bos_token());
    } else {
      ids = std::get<std::vector<int32_t>>(request.prompt);
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= info.vocab_size) {
          return InvalidRequestError("token id " + std::to_string(ids[i]) + " at prompt[" + std::to_string(i) +
                                         "] is outside the vocabulary [0, " + std::to_string(info.vocab_size) + ")",
                                     "prompt");
        }
      }
    }
    if (ids.empty()) return InvalidRequestError("the prompt is empty", param);
    const auto length = static_cast<int64_t>(ids.size());
    if (length >= info.max_model_len) {
      return InvalidRequestError("This model's maximum context length is " + std::to_string(info.max_model_len) +
                                     " tokens. However, your prompt has " + std::to_string(length) +
                                     " tokens, which leaves no room to generate.",
                                 param);
    }
    if (request.max_tokens && length + *request.max_tokens > info.max_model_len) {
      return InvalidRequestError("This model's maximum context length is " + std::to_string(info.max_model_len) +
                                     " tokens. However, you requested " +
                                     std::to_string(length + *request.max_tokens) + " tokens (" +
                                     std::to_string(length) + " in the prompt, " +
                                     std::to_string(*request.max_tokens) + " for the completion).",
                                 request.chat ? "max_completion_tokens" : "max_tokens");
    }
    return ids;
  }

  // "application/json", in any case, with or without parameters ("; charset=utf-8").
  static bool IsJsonMediaType(const std::string& content_type) {
    std::string media;
    for (char c : content_type.substr(0, content_type.find(';'))) {
      if (c != ' ' && c != '\t') media += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return media == "application/json";
  }

  // The method a known path takes; empty for an unknown path.
  static std::string AllowedMethod(const std::string& path) {
    if (path == "/v1/completions" || path == "/v1/chat/completions") return "POST";
    if (path == "/health" || path == "/v1/models" || path == "/metrics") return "GET";
    return "";
  }

  void Generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    // A body sent as something other than JSON (curl -d's form encoding, text/plain) is refused
    // rather than guessed at; no Content-Type at all is taken as JSON.
    if (const std::string type = req.get_header_value("Content-Type"); !type.empty() && !IsJsonMediaType(type)) {
      ApiError error = InvalidRequestError("Unsupported Content-Type '" + type +
                                           "': send the request body as 'application/json'.");
      error.status = 415;
      error.code = "unsupported_media_type";
      return Reply(res, error);
    }
    auto parsed = chat ? ParseChatRequest(req.body, limits_) : ParseCompletionRequest(req.body, limits_);
    if (const auto* error = std::get_if<ApiError>(&parsed)) return Reply(res, *error);
    const auto info = engine_.info();
    if (!info) return Reply(res, ServiceUnavailableError(engine_.unavailable_reason()));
    auto g = std::make_shared<Generation>();
    g->request = std::move(std::get<GenerationRequest>(parsed));
    auto prompt = Tokenize(g->request, *info);
    if (const auto* error = std::get_if<ApiError>(&prompt)) return Reply(res, *error);
    g->prompt = std::move(std::get<std::vector<int32_t>>(prompt));
    g->meta = MakeResponseMeta(g->request);
    g->meta.model = options_.served_model;
    Submit(*g, *info);

    ++in_flight_;
    if (!g->request.stream) {
      Collect(*g, res);
      --in_flight_;
      return;
    }
    // The status line waits for the first event, so that a request the engine refuses (a full
    // queue: 429) gets its HTTP status like a non-streamed one, not a 200 and an error event.
    while (!g->first_event && !shutting_down_) g->first_event = g->stream->Next(kPoll);
    if (!g->first_event || g->first_event->error) {
      AbortAll(*g);
      --in_flight_;
      if (!g->first_event) return Reply(res, ServiceUnavailableError("the server is shutting down"));
      return Reply(res, std::get<ApiError>(Advance(*g, *g->first_event)));
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, g](size_t, httplib::DataSink& sink) {
          Stream(*g, sink);
          sink.done();
          return true;
        },
        [this](bool) { --in_flight_; });
  }

  void Submit(Generation& g, const EngineInfo& info) {
    const GenerationRequest& r = g.request;
    std::random_device random;
    const uint64_t base_seed = r.seed ? *r.seed : (uint64_t{random()} << 32 | random());
    const int64_t max_tokens = r.max_tokens.value_or(info.max_model_len - static_cast<int64_t>(g.prompt.size()));
    std::vector<EngineRequest> requests;
    for (int64_t i = 0; i < r.n; ++i) {
      EngineRequest e;
      e.prompt = g.prompt;
      e.max_tokens = max_tokens;
      e.min_tokens = r.min_tokens;
      e.sampling = r.sampling;
      e.sampling.seed = base_seed + static_cast<uint64_t>(i);  // distinct choices under one seed
      e.logprobs = r.logprobs ? std::max<int64_t>(r.top_logprobs, 1) : 0;
      e.eos_id = tokenizer_.eos_id();
      e.ignore_eos = r.ignore_eos;
      e.stop_token_ids = r.stop_token_ids;
      requests.push_back(std::move(e));
    }
    // Choices are registered before any event is read: events wait in the stream until then.
    const std::vector<RequestId> ids = engine_.Submit(std::move(requests), g.stream);
    for (int64_t i = 0; i < r.n; ++i) {
      g.choice_of[ids[i]] = g.choices.size();
      g.choices.emplace_back(i, ids[i], tokenizer_, r.stop);
    }
  }

  // Applies one event to its choice: the text and log-probs it adds, and whether it finished it.
  // An error event is returned to the caller instead.
  std::variant<ChunkDelta, ApiError> Advance(Generation& g, const StreamEvent& event) {
    if (event.error) {
      ApiError error = event.error->status == 429   ? RateLimitError(event.error->message)
                       : event.error->status == 503 ? ServiceUnavailableError(event.error->message)
                                                    : InvalidRequestError(event.error->message);
      return error;
    }
    const RequestOutput& out = event.output;
    Choice& c = g.choices[g.choice_of.at(out.id)];
    ChunkDelta delta;
    delta.index = c.index;
    delta.first = c.first;
    delta.text_offset = c.code_points;
    c.first = false;
    if (c.done) return delta;  // tokens of a step already in flight when a stop string matched
    g.cached_tokens = out.num_cached_tokens;
    for (size_t i = 0; i < out.new_token_ids.size(); ++i) {
      const int32_t id = out.new_token_ids[i];
      ++c.num_tokens;
      if (!out.new_logprobs.empty()) delta.logprobs.push_back(LogprobOf(id, out.new_logprobs[i], g.request.top_logprobs));
      // A stop token ends the text without being part of it, as in vLLM.
      const bool stop_token = out.finished && i + 1 == out.new_token_ids.size() && out.finish_reason == "stop" &&
                              !g.request.ignore_eos && IsStopToken(g.request, id);
      if (stop_token) break;
      auto piece = c.detokenizer.Push(id);
      const StopMatcher::Result r = c.stop.Push(piece.ok() ? *piece : "\xEF\xBF\xBD");
      delta.text += r.text;
      if (r.stopped) {
        c.done = true;
        delta.finish_reason = "stop";
        engine_.Abort(std::span(&c.id, 1));
        break;
      }
    }
    if (!c.done && out.finished) {
      c.done = true;
      delta.text += c.stop.Push(c.detokenizer.Flush()).text;
      delta.text += c.stop.Flush();
      delta.finish_reason = out.finish_reason == "length" ? "length" : "stop";
    }
    c.code_points += Utf8Length(delta.text);
    return delta;
  }

  bool IsStopToken(const GenerationRequest& r, int32_t id) const {
    return id == tokenizer_.eos_id() ||
           std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), id) != r.stop_token_ids.end();
  }

  // The engine sends the top-k alternatives, then the sampled token if it is not among them.
  LogprobEntry LogprobOf(int32_t id, const std::vector<TokenLogprob>& alternatives, int64_t num_top) const {
    LogprobEntry entry;
    entry.id = id;
    entry.token = TokenText(id);
    const size_t top = std::min<size_t>(alternatives.size(), num_top);
    for (size_t i = 0; i < alternatives.size(); ++i) {
      if (alternatives[i].id == id) entry.logprob = alternatives[i].logprob;
      if (i < top) {
        entry.top.push_back({alternatives[i].id, TokenText(alternatives[i].id), alternatives[i].logprob});
      }
    }
    return entry;
  }

  std::string TokenText(int32_t id) const {
    auto text = tokenizer_.Decode(std::span(&id, 1));
    return text.ok() ? *text : std::string();
  }

  void AbortAll(const Generation& g) {
    std::vector<RequestId> ids;
    for (const Choice& c : g.choices) {
      if (!c.done) ids.push_back(c.id);
    }
    if (!ids.empty()) engine_.Abort(ids);
  }

  void Collect(Generation& g, httplib::Response& res) {
    std::vector<ChoiceResult> results(g.choices.size());
    for (size_t i = 0; i < results.size(); ++i) results[i].index = static_cast<int64_t>(i);
    while (!g.done()) {
      // Checked before each wait, not only when one times out: a request still producing tokens
      // must stop too when the grace period is over.
      if (shutting_down_) {
        AbortAll(g);
        return Reply(res, ServiceUnavailableError("the server is shutting down"));
      }
      auto event = g.stream->Next(kPoll);
      if (!event) continue;
      auto delta = Advance(g, *event);
      if (const auto* error = std::get_if<ApiError>(&delta)) {
        AbortAll(g);
        return Reply(res, *error);
      }
      const ChunkDelta& d = std::get<ChunkDelta>(delta);
      ChoiceResult& result = results[d.index];
      result.text += d.text;
      result.logprobs.insert(result.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      if (!d.finish_reason.empty()) result.finish_reason = d.finish_reason;
    }
    res.set_content(CompletionResponseJson(g.meta, results, g.usage()), "application/json");
  }

  void Stream(Generation& g, httplib::DataSink& sink) {
    auto send = [&](const std::string& json) {
      const std::string event = SseEvent(json);
      return sink.write(event.data(), event.size());
    };
    while (!g.done()) {
      if (shutting_down_) {  // before each wait, as in Collect
        AbortAll(g);
        send(ErrorJson(ServiceUnavailableError("the server is shutting down")));
        break;
      }
      std::optional<StreamEvent> event = std::exchange(g.first_event, std::nullopt);
      if (!event) event = g.stream->Next(kPoll);
      if (!event) {
        // No token for a poll period (queued, a long prefill, a stalled engine): a client that
        // left meanwhile gives its slot back now rather than at its next token.
        if (!sink.is_writable()) return ClientGone(g);
        continue;
      }
      auto delta = Advance(g, *event);
      if (const auto* error = std::get_if<ApiError>(&delta)) {
        AbortAll(g);
        send(ErrorJson(*error));
        break;
      }
      const ChunkDelta& d = std::get<ChunkDelta>(delta);
      if (d.text.empty() && d.logprobs.empty() && d.finish_reason.empty() && !d.first) continue;
      if (!send(StreamChunkJson(g.meta, d))) return ClientGone(g);
    }
    if (g.done() && g.meta.include_usage) send(UsageChunkJson(g.meta, g.usage()));
    const std::string done = SseDone();
    sink.write(done.data(), done.size());
  }

  // Frees the cache of a stream whose client went away, as soon as that is seen. The line comes
  // after the abort is sent, so that whoever reads it knows the engine has been told.
  void ClientGone(const Generation& g) {
    AbortAll(g);
    spdlog::info("{}: the client disconnected after {} tokens; request aborted", g.meta.id, g.usage().completion_tokens);
  }

  const Tokenizer& tokenizer_;
  EngineGroup& engine_;
  const ApiServerOptions& options_;
  const ParseLimits limits_;
  const int64_t started_ = UnixSeconds();
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> shutting_down_{false};
};

}  // namespace

Status RunApiServer(const Tokenizer& tokenizer, EngineGroup& engine, const ApiServerOptions& options) {
  ApiServer server(tokenizer, engine, options);
  return server.Run();
}

}  // namespace moe
