// `wsup cache info` and `wsup cache verify`: flags here, logic in
// client/cache_commands.h.

#include <CLI/CLI.hpp>
#include <memory>
#include <ostream>

#include "supervisor/cache_commands.h"
#include "supervisor/cli.h"

namespace wsup {

namespace {

struct CacheFlags {
  std::string socket;
  std::string model;
  bool json = false;
  int timeout_ms = 10'000;
};

void Print(CliContext& ctx, const CommandOutput& o) {
  *ctx.out << o.out;
  *ctx.err << o.err;
  ctx.exit_code = o.exit_code;
}

}  // namespace

void RegisterCacheCommands(CLI::App& app, CliContext& ctx) {
  // Owned by the app's callbacks for as long as the app lives.
  auto flags = std::make_shared<CacheFlags>();
  CLI::App* cache = app.add_subcommand("cache", "inspect a weight holder: what it serves, and whether it is intact");
  cache->require_subcommand(1);

  CLI::App* info = cache->add_subcommand(
      "info", "fingerprint, tensors, bytes, backend, allocations, attached clients and KV pool of a holder");
  info->add_option("--socket", flags->socket, "the holder's socket")->required();
  info->add_flag("--json", flags->json, "one JSON object instead of text");
  info->add_option("--timeout-ms", flags->timeout_ms, "bound on connecting and the reply (default 10000)")
      ->check(CLI::PositiveNumber);
  info->callback([&ctx, flags] { Print(ctx, CacheInfoCommand(flags->socket, flags->json, flags->timeout_ms)); });

  CLI::App* verify = cache->add_subcommand(
      "verify",
      "read every resident tensor back and compare it with the checkpoint on disk (exit 1 on a difference)");
  verify->add_option("--socket", flags->socket, "the holder's socket")->required();
  verify->add_option("--model", flags->model, "checkpoint folder to compare with")->required();
  verify->add_flag("--json", flags->json, "one JSON object instead of text");
  verify->add_option("--timeout-ms", flags->timeout_ms, "bound on connecting and the reply (default 10000)")
      ->check(CLI::PositiveNumber);
  verify->callback([&ctx, flags] {
    Print(ctx, CacheVerifyCommand(flags->socket, flags->model, flags->json, flags->timeout_ms));
  });
}

}  // namespace wsup
