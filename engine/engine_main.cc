// wsup-engine: the reference inference engine. Flags only; the program is
// engine/engine_server.h.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "common/log.h"
#include "engine/engine_server.h"
#include "http/control_auth.h"

// A function-try-block: an exception that escapes the flags' setup or the
// engine (a bug: errors are Status values) is printed, not a bare abort.
int main(int argc, char** argv) try {
  wsup::engine::EngineOptions o;
  std::string log_level = "info";
  CLI::App app{"wsup-engine: serves a Llama-family, Qwen3-MoE or DeepSeek-V3 model over an OpenAI-compatible HTTP API"};
  app.add_option("--model", o.model_dir, "Hugging Face model folder")->required();
  app.add_option("--model-name", o.model_name, "name served as 'model' (default: the folder's name)");
  app.add_option("--host", o.host, "address to listen on");
  app.add_option("--port", o.port, "port to listen on; 0 picks a free one (printed as 'listening on HOST:PORT')");
  app.add_option("--weight-cache", o.weight_cache, "daemon | client | off");
  app.add_option("--socket", o.socket, "holder socket path, one per rank, comma-separated");
  app.add_option("--revision", o.revision, "revision label, as given to the holder");
  app.add_option("--layout", o.layout,
                 "checkpoint: attach the checkpoint's tensors (default); engine: attach this engine's own "
                 "layout from a holder started with --layout engine, publishing it when nobody has");
  app.add_option("--layout-wait-ms", o.layout_wait_ms,
                 "--layout engine: longest wait for another engine's commit of the same layout (default 600000)");
  app.add_option("--device", o.device, "cpu | cuda:N[,M...]");
  app.add_option("--tp", o.tp, "tensor-parallel ranks (threads) for --device cpu");
  app.add_option("--ep-size", o.ep_size,
                 "expert parallelism for mixture-of-experts models: 1 (every expert split by --tp, the default) "
                 "or the tp size (each rank holds whole experts, as holders started with the same --ep-size)");
  app.add_flag("--expert-parallel", o.expert_parallel, "expert parallelism with ep size = tp size (--ep-size TP)");
  app.add_option("--kv-cache-mib", o.kv_cache_mib, "KV cache per rank, MiB, allocated at startup (a private cache)");
  app.add_flag("--kv-pool", o.kv_pool,
               "use the node's KV pool (each rank's holder makes it: wsup-holder --kv-pool-mib) while the supervisor "
               "makes this engine its owner (POST /wsup/role), and a scratch of --kv-scratch-mib otherwise; "
               "--kv-cache-mib is then not used");
  app.add_option("--kv-scratch-mib", o.kv_scratch_mib,
                 "with --kv-pool: this engine's own KV cache per rank, MiB (probes and the first requests)");
  app.add_option("--dequant-scratch-mib", o.dequant_scratch_mib,
                 "cuda: the float32 scratch that wide products over f16/FP8 weights widen them into, MiB "
                 "(wider matrices go in row slices)");
  app.add_option("--matmul", o.matmul,
                 "cuda: wide products (prompts, batches over 8) over bfloat16 weights run on tensor cores with the "
                 "activations as two bfloat16 terms, close to float32 (split, the default), or as one (bf16: "
                 "about twice as fast, bfloat16 arithmetic)");
  app.add_option("--nccl-max-ctas", o.nccl_max_ctas,
                 "cuda: channels per NCCL communicator (0: one for a single rank, NCCL's choice for more)");
  app.add_option("--comm-keepalive-ms", o.comm_keepalive_ms, "interval of the communicator keepalive");
  app.add_option("--kv-adopt-wait-ms", o.kv_adopt_wait_ms,
                 "--kv-pool: longest wait of a stream resumed after a crash for the pool, to adopt the dead engine's "
                 "KV (default 2000; 0: no wait)");
  app.add_option("--kv-adopt-keep-ms", o.kv_adopt_keep_ms,
                 "--kv-pool: how long the dead engine's KV pages are kept for resumed streams once the pool is "
                 "here (default 10000)");
  app.add_option("--min-step-ms", o.min_step_ms,
                 "each step takes at least this long: paces generation for drills and demos (default 0: off)");
  app.add_option("--max-step-ms", o.max_step_ms,
                 "a step's prompt chunks are sized to end within this, so that long prompts never hold back other "
                 "streams' tokens or the supervisor's probe (default: 50 on cuda, 100 on the CPU; 0: off)");
  app.add_option("--ready-fd", o.ready_fd, "fd that gets 'listening on HOST:PORT' once ready, then is closed");
  if (const char* n = std::getenv("WSUP_ENGINE_NONCE")) o.nonce = n;
  if (const char* t = std::getenv(wsup::http::kControlTokenEnv)) o.control_token = t;
  app.add_option("--nonce", o.nonce, "identity echoed in /wsup/status (default: $WSUP_ENGINE_NONCE)");
  app.add_option("--max-batch", o.max_batch, "sequences decoded together in one step");
  app.add_option("--threads", o.threads, "compute threads per rank (0: the CPUs this process may run on / tp)");
  app.add_option("--kv-block-size", o.block_size, "tokens per KV cache block");
  app.add_option("--max-body-bytes", o.max_body_bytes, "largest request body accepted");
  app.add_option("--header-timeout-ms", o.header_timeout_ms, "time a client has to send a request's headers");
  app.add_option("--idle-timeout-ms", o.idle_timeout_ms, "keep-alive connections idle longer are closed");
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : wsup::engine::kEngineExitUsage;
  }
  wsup::InitLogging("wsup-engine", log_level);
  return wsup::engine::RunEngine(o);
} catch (const std::exception& e) {
  std::fprintf(stderr, "wsup-engine: unexpected exception: %s\n", e.what());
  return wsup::engine::kEngineExitFailure;
}
