// The `wsup` command line: one CLI11 app whose subcommands each register
// from their own function in their own file, so that `start`, `check`,
// `status`, `failover`, `report` and `stop` are added beside `cache`
// without touching each other. To add one: write
//   void RegisterXxxCommand(CLI::App& app, CliContext& ctx);
// in supervisor/cli_xxx.cc, declare it below, list it in kCommands in
// cli.cc, and add the source to the wsup_cli library.
//
// A subcommand's callback does its work and sets ctx.exit_code; it writes
// through ctx.out / ctx.err so that tests can capture what it prints.
// Exceptions stay inside RunCli (CLI11 throws on bad flags).
//
// Exit codes: 0 success; 2 a usage error (unknown flag, missing value);
// otherwise what the subcommand sets (see each one).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace wsup {

struct CliContext {
  int exit_code = 0;
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
};

inline constexpr int kCliExitUsage = 2;

// `wsup cache info|verify` (supervisor/cli_cache.cc).
void RegisterCacheCommands(CLI::App& app, CliContext& ctx);
// `wsup start|check|status|failover|report|stop` (supervisor/cli_node.cc).
void RegisterNodeCommands(CLI::App& app, CliContext& ctx);

// Parses argv (argv[0] is the program name), runs the chosen subcommand and
// returns the exit code. Output goes to `out` and `err`.
int RunCli(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

}  // namespace wsup
