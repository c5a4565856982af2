// Logging: spdlog to stderr with the program name, so that journald and test
// logs show who said what. Call InitLogging() once at the top of a main.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace wsup {

// level: "trace", "debug", "info", "warn", "error"; WSUP_LOG_LEVEL overrides.
void InitLogging(const std::string& program, const std::string& level = "info");

}  // namespace wsup
