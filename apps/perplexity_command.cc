#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "apps/commands.h"
#include "engine/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace moe {
namespace {

struct PerplexityOptions {
  std::string model = kDefaultModelDir;
  std::string file, dtype = "w8a8";
  int64_t window = 256;
  bool json = false;
};

int Run(const PerplexityOptions& o) {
  std::ifstream in(o.file, std::ios::binary);
  if (!in) return Fail(Status::Error(o.file + ": cannot open the text file"));
  std::stringstream text;
  text << in.rdbuf();

  auto tokenizer = Tokenizer::Load(o.model);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  auto dtype = ParseDType(o.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  auto model = DeepseekV3Model::Load(o.model, *dtype);
  if (!model.ok()) return Fail(model.status());

  const std::vector<int32_t> ids = tokenizer->Encode(text.str(), /*add_bos=*/false);
  spdlog::info("{}: {} tokens in windows of {}", o.file, ids.size(), o.window);
  LocalExpertBackend experts;
  auto result = Perplexity(**model, experts, ids, o.window, tokenizer->bos_id(), [](int64_t done, int64_t total) {
    if (done % 10 == 0 || done == total) spdlog::info("window {}/{}", done, total);
  });
  if (!result.ok()) return Fail(result.status());

  if (o.json) {
    std::cout << nlohmann::json{{"perplexity", result->perplexity()},
                                {"nll", result->total_nll},
                                {"tokens", result->scored_tokens},
                                {"windows", result->windows}}
                     .dump()
              << "\n";
  } else {
    std::cout << "perplexity " << result->perplexity() << " over " << result->scored_tokens << " tokens in "
              << result->windows << " windows\n";
  }
  return 0;
}

}  // namespace

CommandRunner AddPerplexityCommand(CLI::App& app) {
  auto o = std::make_shared<PerplexityOptions>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity",
      "perplexity of a text file. The text is tokenized without BOS and cut into non-overlapping windows of "
      "--window tokens; each window runs from an empty cache with BOS prepended (when the tokenizer has one), "
      "and every token of it is scored given the tokens before it in its window.");
  cmd->add_option("--model", o->model, "checkpoint directory")->capture_default_str();
  cmd->add_option("--file", o->file, "UTF-8 text file")->required();
  cmd->add_option("--window", o->window, "tokens per window")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--dtype", o->dtype, "precision of linear layers: f32, bf16 or w8a8 (INT8 weights and activations)")->capture_default_str();
  cmd->add_flag("--json", o->json, "print {\"perplexity\", \"nll\", \"tokens\", \"windows\"}");
  return [o] { return Run(*o); };
}

}  // namespace moe
