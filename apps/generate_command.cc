#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "apps/commands.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "tokenizer/tokenizer.h"

namespace moe {
namespace {

struct GenerateOptions {
  std::string model = kDefaultModelDir;
  std::string prompt, prompt_ids, chat, input_file;
  int64_t max_tokens = 64;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  int64_t logprobs = 0;
  int64_t mtp_logprobs = 0;
  std::string dtype = "w8a8";
  bool json = false;
  bool ignore_eos = false;
};

Expected<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 0 || value > INT32_MAX) {
      return Status::Error("--prompt-ids: '" + item + "' is not a token id (a non-negative integer)");
    }
    ids.push_back(static_cast<int32_t>(value));
  }
  if (ids.empty()) return Status::Error("--prompt-ids: no ids given");
  return ids;
}

Expected<std::vector<int32_t>> PromptIds(const GenerateOptions& o, const Tokenizer* tokenizer) {
  if (!o.prompt_ids.empty()) return ParseIds(o.prompt_ids);
  MOE_CHECK(tokenizer != nullptr, "a text prompt needs the tokenizer");
  if (!o.chat.empty()) {
    MOE_ASSIGN_OR_RETURN(std::string text, tokenizer->ApplyChatTemplate({{"user", o.chat}}, true));
    return tokenizer->Encode(text, /*add_bos=*/false);
  }
  return tokenizer->Encode(o.prompt, tokenizer->add_bos_token());
}

nlohmann::json LogprobsJson(const std::vector<std::vector<TokenLogprob>>& positions) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& position : positions) {
    nlohmann::json top = nlohmann::json::array();
    for (const TokenLogprob& t : position) top.push_back({{"id", t.id}, {"logprob", t.logprob}});
    out.push_back(std::move(top));
  }
  return out;
}

// The text of generated tokens; ids the tokenizer does not know (padding rows of the vocabulary)
// and the closing end-of-sequence token contribute nothing.
std::string DetokenizeAll(const Tokenizer& tokenizer, const GenerateResult& result, std::optional<int32_t> eos) {
  IncrementalDetokenizer detokenizer(tokenizer);
  std::string text;
  for (int32_t id : result.tokens) {
    if (eos && id == *eos && result.finish_reason == "stop") continue;
    auto piece = detokenizer.Push(id);
    if (piece.ok()) text += *piece;
  }
  return text + detokenizer.Flush();
}

// One line of a --input-file: {"prompt": TEXT} | {"prompt_ids": [...]} | {"chat": TEXT}, with optional
// "max_tokens", "temperature" and "seed" overriding the flags.
Expected<EngineRequest> ParseBatchLine(const std::string& line, const std::string& where, const GenerateOptions& o,
                                       const Tokenizer& tokenizer) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::Error(where + ": not a JSON object");
  EngineRequest r;
  r.max_tokens = o.max_tokens;
  r.sampling = {.temperature = o.temperature, .top_p = o.top_p, .top_k = o.top_k, .seed = o.seed};
  r.ignore_eos = o.ignore_eos;
  r.eos_id = tokenizer.eos_id();
  if (j.contains("prompt_ids") && j["prompt_ids"].is_array()) {
    for (const auto& id : j["prompt_ids"]) {
      if (!id.is_number_integer()) return Status::Error(where + ": prompt_ids must hold integers");
      r.prompt.push_back(id.get<int32_t>());
    }
  } else if (j.contains("prompt") && j["prompt"].is_string()) {
    r.prompt = tokenizer.Encode(j["prompt"].get<std::string>(), tokenizer.add_bos_token());
  } else if (j.contains("chat") && j["chat"].is_string()) {
    MOE_ASSIGN_OR_RETURN(std::string text, tokenizer.ApplyChatTemplate({{"user", j["chat"].get<std::string>()}}, true));
    r.prompt = tokenizer.Encode(text, /*add_bos=*/false);
  } else {
    return Status::Error(where + ": needs \"prompt\" (a string), \"prompt_ids\" (a list) or \"chat\" (a string)");
  }
  if (j.contains("max_tokens")) {
    if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() < 1) {
      return Status::Error(where + ": max_tokens must be a positive integer");
    }
    r.max_tokens = j["max_tokens"].get<int64_t>();
  }
  if (j.contains("temperature")) {
    if (!j["temperature"].is_number() || j["temperature"].get<double>() < 0) {
      return Status::Error(where + ": temperature must be a non-negative number");
    }
    r.sampling.temperature = j["temperature"].get<double>();
  }
  if (j.contains("seed")) {
    if (!j["seed"].is_number_unsigned()) return Status::Error(where + ": seed must be a non-negative integer");
    r.sampling.seed = j["seed"].get<uint64_t>();
  }
  return r;
}

// --input-file: every line a request, all run together through the batching engine; one JSON line
// out per line in, in input order.
int RunBatch(const GenerateOptions& o, DType dtype) {
  auto tokenizer = Tokenizer::Load(o.model);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  std::ifstream in(o.input_file);
  if (!in) return Fail(Status::Error(o.input_file + ": cannot open the input file"));
  std::vector<EngineRequest> requests;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto request = ParseBatchLine(line, o.input_file + ":" + std::to_string(number), o, *tokenizer);
    if (!request.ok()) return Fail(request.status());
    request->id = static_cast<RequestId>(requests.size());
    requests.push_back(std::move(request).value());
  }
  if (requests.empty()) return Fail(Status::Error(o.input_file + ": no requests"));

  spdlog::info("loading {} ({}); {} requests", o.model, o.dtype, requests.size());
  auto model = DeepseekV3Model::Load(o.model, dtype);
  if (!model.ok()) return Fail(model.status());
  LocalExpertBackend experts;
  Engine engine(**model, experts, EngineConfig{});
  for (const EngineRequest& r : requests) {
    if (Status s = engine.AddRequest(r); !s.ok()) return Fail(s.WithContext(o.input_file));
  }
  std::vector<std::vector<int32_t>> tokens(requests.size());
  std::vector<std::string> reasons(requests.size());
  while (engine.HasUnfinishedRequests()) {
    for (const RequestOutput& out : engine.Step()) {
      tokens[out.id].insert(tokens[out.id].end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished) reasons[out.id] = out.finish_reason;
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    GenerateResult result;
    result.tokens = tokens[i];
    result.finish_reason = reasons[i];
    const nlohmann::json out = {{"index", i},
                                {"prompt_ids", requests[i].prompt},
                                {"token_ids", tokens[i]},
                                {"text", DetokenizeAll(*tokenizer, result, requests[i].eos_id)},
                                {"finish_reason", reasons[i]}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

int Run(const GenerateOptions& o) {
  const int prompts_given =
      !o.prompt.empty() + !o.prompt_ids.empty() + !o.chat.empty() + !o.input_file.empty();
  if (prompts_given != 1) {
    return Fail(Status::Error("give exactly one of --prompt, --prompt-ids, --chat and --input-file"));
  }
  auto dtype = ParseDType(o.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  if (!o.input_file.empty()) return RunBatch(o, *dtype);

  // The tokenizer is needed for text prompts; with --prompt-ids it only renders the output text.
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto loaded = Tokenizer::Load(o.model); loaded.ok()) {
    tokenizer = std::make_unique<Tokenizer>(std::move(loaded).value());
  } else if (o.prompt_ids.empty()) {
    return Fail(loaded.status());
  }

  auto prompt = PromptIds(o, tokenizer.get());
  if (!prompt.ok()) return Fail(prompt.status());

  spdlog::info("loading {} ({})", o.model, o.dtype);
  auto model = DeepseekV3Model::Load(o.model, *dtype);
  if (!model.ok()) return Fail(model.status());

  GenerateRequest request;
  request.prompt = *prompt;
  request.max_tokens = o.max_tokens;
  request.sampling = {.temperature = o.temperature, .top_p = o.top_p, .top_k = o.top_k, .seed = o.seed};
  request.logprobs = o.logprobs;
  request.mtp_logprobs = o.mtp_logprobs;
  request.ignore_eos = o.ignore_eos;
  request.eos_id = tokenizer && tokenizer->eos_id() ? tokenizer->eos_id()
                   : (*model)->config().eos_token_id ? std::optional<int32_t>(*(*model)->config().eos_token_id)
                                                     : std::nullopt;

  // Without --json the text streams to stdout as it is generated.
  std::unique_ptr<IncrementalDetokenizer> stream;
  if (!o.json && tokenizer) stream = std::make_unique<IncrementalDetokenizer>(*tokenizer);
  auto on_token = [&](int32_t id) {
    if (!stream || id == request.eos_id) return;
    if (auto piece = stream->Push(id); piece.ok()) std::cout << *piece << std::flush;
  };

  LocalExpertBackend experts;
  auto result = Generate(**model, experts, request, on_token);
  if (!result.ok()) return Fail(result.status());

  if (o.json) {
    nlohmann::json out = {{"prompt_ids", request.prompt},
                          {"token_ids", result->tokens},
                          {"text", tokenizer ? DetokenizeAll(*tokenizer, *result, request.eos_id) : ""},
                          {"finish_reason", result->finish_reason}};
    if (o.logprobs > 0) out["logprobs"] = LogprobsJson(result->logprobs);
    if (o.mtp_logprobs > 0) out["mtp_logprobs"] = LogprobsJson(result->mtp_logprobs);
    // Invalid UTF-8 in text (a token that splits a character) is replaced rather than thrown on.
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    if (stream) std::cout << stream->Flush();
    std::cout << "\n";
    if (!tokenizer) {
      for (int32_t id : result->tokens) std::cout << id << " ";
      std::cout << "\n";
    }
  }
  return 0;
}

}  // namespace

CommandRunner AddGenerateCommand(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "generate a continuation of one prompt");
  cmd->add_option("--model", o->model, "checkpoint directory (config.json, *.safetensors, tokenizer.json)")->capture_default_str();
  cmd->add_option("--prompt", o->prompt, "prompt text (BOS added as tokenizer_config.json says)");
  cmd->add_option("--prompt-ids", o->prompt_ids, "prompt token ids, comma-separated, used verbatim");
  cmd->add_option("--chat", o->chat, "a user message, wrapped in the model's chat template");
  cmd->add_option("--input-file", o->input_file,
                  "JSONL of requests, run batched: each line {\"prompt\"|\"prompt_ids\"|\"chat\": ..., "
                  "optional \"max_tokens\", \"temperature\", \"seed\"}; prints one JSON line per request");
  cmd->add_option("--max-tokens", o->max_tokens, "most tokens to generate")->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--temperature", o->temperature, "0 is greedy")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-p", o->top_p, "nucleus sampling mass")->check(CLI::Range(0.0, 1.0, "(0, 1]"));
  cmd->add_option("--top-k", o->top_k, "sample among the k most likely tokens (0: all)")->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--seed", o->seed, "sampling seed");
  cmd->add_option("--logprobs", o->logprobs, "report the top K log-probs of each generated token")
      ->check(CLI::Range(int64_t{0}, int64_t{1000}));
  cmd->add_option("--mtp-logprobs", o->mtp_logprobs,
                  "report the top K log-probs of the MTP head at every position whose next token is known")
      ->check(CLI::Range(int64_t{0}, int64_t{1000}));
  cmd->add_option("--dtype", o->dtype, "precision of linear layers: f32, bf16 or w8a8 (INT8 weights and activations)")->capture_default_str();
  cmd->add_flag("--json", o->json, "print one JSON object: prompt_ids, token_ids, text, logprobs");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep generating past the end-of-sequence token");
  return [o] { return Run(*o); };
}

}  // namespace moe
