#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "tokenizer/tokenizer.h"

namespace moe {

CommandRunner AddTokenizeCommand(CLI::App& app) {
  struct Options {
    std::string model = kDefaultModelDir;
    std::string text;
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("tokenize", "print the token ids of a text (BOS added when tokenizer_config.json says add_bos_token)");
  cmd->add_option("--model", options->model, "checkpoint directory with tokenizer.json")->capture_default_str();
  cmd->add_option("--text", options->text, "text to encode")->required();
  cmd->add_flag("--json", options->json, "print {\"ids\":[...]}");

  return [options] {
    auto tokenizer = Tokenizer::Load(options->model);
    if (!tokenizer.ok()) return Fail(tokenizer.status());
    const std::vector<int32_t> ids = tokenizer->Encode(options->text, tokenizer->add_bos_token());
    if (options->json) {
      std::cout << nlohmann::json{{"ids", ids}}.dump() << "\n";
    } else {
      for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
      std::cout << "\n";
    }
    return 0;
  };
}

}  // namespace moe
