#include "supervisor/cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <ostream>

namespace wsup {

namespace {

using Registrar = void (*)(CLI::App&, CliContext&);

// Every subcommand of `wsup`, in the order --help lists them.
constexpr Registrar kCommands[] = {
    &RegisterNodeCommands,
    &RegisterCacheCommands,
};

}  // namespace

int RunCli(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  CliContext ctx;
  ctx.out = &out;
  ctx.err = &err;
  CLI::App app{"wsup: keeps model inference up through crashes (weight holder, supervisor, failover)", "wsup"};
  app.require_subcommand(1);
  for (Registrar r : kCommands) r(app, ctx);
  // CLI11 wants argv in reverse without the program name.
  std::vector<std::string> args(argv.size() > 1 ? argv.begin() + 1 : argv.end(), argv.end());
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e, out, err);
    return rc == 0 ? 0 : kCliExitUsage;
  } catch (const std::exception& e) {
    err << "wsup: " << e.what() << "\n";
    return 1;
  }
  return ctx.exit_code;
}

}  // namespace wsup
