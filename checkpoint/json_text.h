// What the readers of a checkpoint's JSON (config.json, the shard index,
// safetensors headers) and its checks share: quoting a value or a tensor's
// name into a message and the nesting check before parsing. Internal to
// checkpoint/.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace wsup::checkpoint_text {

// At most about 80 characters of `v`, so a hostile file cannot fill a log
// line with what it says.
std::string Quote(const nlohmann::json& v);

// 'name', for a tensor's name in a message.
std::string QuoteTensor(std::string_view name);

// Refuses text nested deeper than real headers and configs are
// (common/json_limits.h), before it is parsed, as Corrupt.
Status CheckDepth(std::string_view text, const std::string& what, const std::string& fix);

}  // namespace wsup::checkpoint_text
