#include "common/log.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>

namespace wsup {

void InitLogging(const std::string& program, const std::string& level) {
  auto logger = spdlog::stderr_logger_mt(program);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %n[%P] %l: %v");
  const char* env = std::getenv("WSUP_LOG_LEVEL");
  logger->set_level(spdlog::level::from_str(env && *env ? env : level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace wsup
