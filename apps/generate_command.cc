#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "apps/commands.h"
#include "engine/generate.h"
#include "tokenizer/tokenizer.h"

namespace moe {
namespace {

struct GenerateOptions {
  std::string model = kDefaultModelDir;
  std::string prompt, prompt_ids, chat;
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

int Run(const GenerateOptions& o) {
  const int prompts_given = !o.prompt.empty() + !o.prompt_ids.empty() + !o.chat.empty();
  if (prompts_given != 1) return Fail(Status::Error("give exactly one of --prompt, --prompt-ids and --chat"));
  auto dtype = ParseDType(o.dtype);
  if (!dtype.ok()) return Fail(dtype.status());

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
