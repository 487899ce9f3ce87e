// The subcommands of the moe-serve binary: each registers its options on the CLI and runs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/status.h"
#include "tensor/dtype.h"

namespace moe {

// The model bundled in the source tree (models/), used when --model is not given.
inline constexpr const char* kDefaultModelDir = MOE_DEFAULT_MODEL_DIR;

// Each returns the process exit code when the subcommand was chosen.
using CommandRunner = std::function<int()>;

CommandRunner AddGenerateCommand(CLI::App& app);
CommandRunner AddTokenizeCommand(CLI::App& app);
CommandRunner AddPerplexityCommand(CLI::App& app);
CommandRunner AddBenchOfflineCommand(CLI::App& app);
// A client: loads a running server over HTTP (needs no model files).
CommandRunner AddBenchServeCommand(CLI::App& app);
// `argv` is the whole command line, which serve re-runs for its engine and API-server processes.
CommandRunner AddServeCommand(CLI::App& app, std::vector<std::string> argv);

// Prints "error: <message>" on stderr and returns the exit code for it.
int Fail(const Status& status);

// The --dtype flag: "f32", "bf16" or "w8a8" (INT8 weights and activations).
Expected<DType> ParseDType(const std::string& name);

}  // namespace moe
