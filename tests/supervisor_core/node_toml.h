// The smallest whole node config, as the tests of the supervisor's config
// rules (reload plans, probe expectations) parse it.
#pragma once

#include <string>

namespace wsup::test {

// [node] "t" (state and run folders beside the file), [model] "model",
// [engine] on ports 8001 and 8002, then `probe` (its lines, each ending in
// a newline) as the [probe] section, then [front] on 127.0.0.1:8000 and
// [admin] on 127.0.0.1:9090. The [probe] header is line 11, so the probe's
// first line is line 12.
inline std::string NodeToml(const std::string& probe) {
  return "[node]\nname = \"t\"\nstate_dir = \"state\"\nruntime_dir = \"run\"\n"
         "[model]\npath = \"model\"\n"
         "[engine]\ncommand = [\"eng\", \"--port\", \"{port}\"]\nprimary_port = 8001\nstandby_port = 8002\n"
         "[probe]\n" +
         probe + "[front]\nlisten = \"127.0.0.1:8000\"\n[admin]\nlisten = \"127.0.0.1:9090\"\n";
}

}  // namespace wsup::test
