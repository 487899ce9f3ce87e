// Logging goes to stderr so that stdout stays clean for --json output.
#pragma once

#include <spdlog/spdlog.h>

namespace moe {

// Installs the stderr logger as spdlog's default. Call once at the start of main().
void InitLogging(bool verbose);

}  // namespace moe
