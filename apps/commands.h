// The subcommands of the moe-serve binary: each registers its options on the CLI and runs.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace moe {

// Each returns the process exit code when the subcommand was chosen.
using CommandRunner = std::function<int()>;

CommandRunner AddGenerateCommand(CLI::App& app);
CommandRunner AddTokenizeCommand(CLI::App& app);

}  // namespace moe
