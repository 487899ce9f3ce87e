#include "base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace moe {

void InitLogging(bool verbose) {
  auto logger = spdlog::stderr_color_mt("moe");
  logger->set_pattern("[%H:%M:%S.%e] %^%l%$ %v");
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace moe
