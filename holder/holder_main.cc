// wsup-holder: keeps one rank's model weights resident and hands them to
// engines as file descriptors, and the rank's KV pool beside them. Flags
// only; the program is holder/holder_app.h.

#include <CLI/CLI.hpp>

#include "common/log.h"
#include "holder/holder_app.h"

int main(int argc, char** argv) {
  wsup::HolderConfig cfg;
  std::string log_level = "info";
  int tp_size = 1, tp_rank = 0, ep_size = 1, ep_rank = 0;
  CLI::App app{"wsup-holder: keeps one rank's model weights resident (host memory or CUDA VMM) and hands them "
               "to engines over a Unix socket as file descriptors."};
  app.add_option("--model", cfg.model_dir, "checkpoint folder (config.json and *.safetensors)");
  app.add_option("--layout", cfg.layout,
                 "checkpoint: serve the checkpoint's own tensors, loaded from --model (default); engine: "
                 "load nothing, keep the layouts engines publish, one per fingerprint")
      ->check(CLI::IsMember({"checkpoint", "engine"}));
  app.add_option("--socket", cfg.socket_path, "holder socket path, in a private directory (mode 0700)")->required();
  app.add_option("--backend", cfg.backend, "where the weights live: host or cuda (default host)")
      ->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--device", cfg.device, "cuda device ordinal (default 0)");
  auto* tp_size_opt = app.add_option("--tp-size", tp_size, "tensor-parallel size (default 1)");
  auto* tp_rank_opt = app.add_option("--tp-rank", tp_rank, "this holder's tensor-parallel rank (default 0)");
  auto* ep_size_opt = app.add_option("--ep-size", ep_size,
                                     "expert-parallel size: 1 (default), or --tp-size to partition a "
                                     "mixture-of-experts model's routed experts whole across the ranks");
  auto* ep_rank_opt = app.add_option("--ep-rank", ep_rank,
                                     "this holder's expert-parallel rank, equal to --tp-rank (default 0)");
  app.add_option("--ready-fd", cfg.ready_fd, "inherited fd to write \"ready <socket>\\n\" to once serving");
  app.add_option("--deployment", cfg.deployment, "deployment name, shown by 'wsup cache info'");
  app.add_option("--revision", cfg.revision, "revision label of the model; part of the fingerprint");
  app.add_option("--adopt-manifest", cfg.adopt_manifest,
                 "arena record (manifest + fingerprint) of kept fds: start from them, reading no checkpoint");
  app.add_option("--adopt-fds", cfg.adopt_fds, "inherited arena fds, one per allocation in order, e.g. 3,4");
  app.add_option("--adopt-layouts", cfg.adopt_layouts,
                 "with --layout engine: a layouts record of kept engine-made layouts, whose inherited fds it "
                 "names; start with them committed (one that disagrees with its fds is refused and logged)");
  app.add_option("--layout-max-bytes", cfg.layout_max_bytes,
                 "with --layout engine: the most bytes granted to writing and committed layouts together; a "
                 "grant past it is refused (default 0: no cap)");
  app.add_option(
      "--kv-pool-mib", cfg.kv_pool_mib,
      "make the node's KV pool for this rank at start: N MiB on the holder's backend (host: one memfd, "
      "every page allocated now; cuda: VMM memory on --device), served to engines as fds by the "
      "kv_pool request; a pool that cannot be made fails the start (default 0: no pool)");
  app.add_option(
      "--adopt-kv-pool", cfg.adopt_kv_pool,
      "a KV pool record of a kept pool, whose inherited fds it names: serve that pool, under its id, "
      "instead of making one (one that disagrees with its fds is logged, its fds closed, and a new "
      "pool made with --kv-pool-mib)");
  app.add_option("--read-threads", cfg.read_threads, "parallel checkpoint readers (default 4)");
  app.add_option("--handshake-timeout-ms", cfg.handshake_timeout_ms,
                 "time a client has to send its first request, finish one it began, or take some of a "
                 "reply (default 10000)");
  app.add_option("--idle-timeout-ms", cfg.idle_timeout_ms,
                 "a connection without a request for this long is closed; attached clients keep their "
                 "mapping, an attached keeper is exempt (default 60000)");
  app.add_option("--max-connections", cfg.max_connections,
                 "open connections at most; past it the one idle longest is closed to admit a new one "
                 "(default 1000)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error (default info)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : wsup::kHolderExitUsage;
  }
  if (tp_size_opt->count() > 0) cfg.tp_size = tp_size;
  if (tp_rank_opt->count() > 0) cfg.tp_rank = tp_rank;
  if (ep_size_opt->count() > 0) cfg.ep_size = ep_size;
  if (ep_rank_opt->count() > 0) cfg.ep_rank = ep_rank;
  wsup::InitLogging("wsup-holder", log_level);
  return wsup::RunHolder(cfg);
}
