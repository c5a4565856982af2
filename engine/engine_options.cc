// The options' checks (ValidateEngineOptions) and what they derive: the
// devices (ParseDevice) and the expert-parallel size.
#include <algorithm>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_server.h"

namespace wsup::engine {

// "cpu" -> {}, "cuda:0,1" -> {0, 1}.
Result<std::vector<int>> ParseDevice(const std::string& d) {
  if (d == "cpu") return std::vector<int>{};
  if (d.rfind("cuda:", 0) != 0) {
    return InvalidArgument("--device '" + d + "' is not one of cpu, cuda:N[,M...]");
  }
  std::vector<int> out;
  std::string rest = d.substr(5);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    if (comma == std::string::npos) comma = rest.size();
    std::string n = rest.substr(pos, comma - pos);
    if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgument("--device '" + d + "': '" + n + "' is not a GPU ordinal; write cuda:0 or cuda:0,1");
    }
    out.push_back(std::stoi(n));
    pos = comma + 1;
  }
  return out;
}

Status ValidateEngineOptions(const EngineOptions& o) {
  if (o.model_dir.empty()) return InvalidArgument("--model is required: the Hugging Face model folder");
  if (o.port < 0 || o.port > 65535) return InvalidArgument("--port " + std::to_string(o.port) + " is out of range; pass 0 to 65535 (0 picks a free port)");
  if (o.weight_cache != "daemon" && o.weight_cache != "client" && o.weight_cache != "off") {
    return InvalidArgument("--weight-cache '" + o.weight_cache + "' is not one of daemon, client, off");
  }
  if (o.weight_cache != "off" && o.socket.empty()) {
    return InvalidArgument("--weight-cache " + o.weight_cache + " needs --socket PATH (the holder's socket, one per rank)");
  }
  if (o.layout != "checkpoint" && o.layout != "engine") {
    return InvalidArgument("--layout '" + o.layout + "' is not one of checkpoint, engine");
  }
  if (o.layout == "engine" && o.weight_cache == "off") {
    return InvalidArgument("--layout engine publishes to or attaches from a holder: pass --weight-cache client or "
                           "daemon with --socket, or drop --layout engine");
  }
  if (o.layout == "engine" && o.device != "cpu") {
    return InvalidArgument("--layout engine: the reference engine publishes and attaches host-memory layouts only "
                           "(its CUDA path computes from the checkpoint's own tensors); use --device cpu, or "
                           "--layout checkpoint on the GPU");
  }
  if (o.layout_wait_ms < 0 || o.layout_wait_ms > 3'600'000) {
    return InvalidArgument("--layout-wait-ms " + std::to_string(o.layout_wait_ms) + " is out of range; pass 0 to 3600000");
  }
  auto devices = ParseDevice(o.device);
  if (!devices.ok()) return devices.error();
  if (o.tp < 1 || o.tp > 64) return InvalidArgument("--tp " + std::to_string(o.tp) + " is out of range; pass 1 to 64");
  if (!devices->empty()) {
    if (o.tp != 1 && static_cast<size_t>(o.tp) != devices->size()) {
      return InvalidArgument("--tp " + std::to_string(o.tp) + " with --device " + o.device +
                             ": on GPUs there is one rank per listed device; drop --tp or list " + std::to_string(o.tp) +
                             " devices");
    }
    std::vector<int> sorted = *devices;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return InvalidArgument("--device " + o.device + " lists a GPU twice; each rank needs its own GPU");
    }
  }
  const int tp = devices->empty() ? o.tp : static_cast<int>(devices->size());
  if (o.ep_size != 1 && o.ep_size != tp) {
    return InvalidArgument("--ep-size " + std::to_string(o.ep_size) + " with " + std::to_string(tp) +
                           " tensor-parallel rank(s): expert parallelism spans the tensor-parallel ranks, so pass "
                           "--ep-size " + std::to_string(tp) + " (or --expert-parallel), or --ep-size 1");
  }
  if (o.expert_parallel && tp == 1) {
    return InvalidArgument("--expert-parallel at --tp 1: one rank holds every expert already; pass --tp N "
                           "(N dividing the experts) or drop --expert-parallel");
  }
  if (o.kv_cache_mib < 1 || o.kv_cache_mib > (1 << 22)) {
    return InvalidArgument("--kv-cache-mib " + std::to_string(o.kv_cache_mib) + " is out of range; pass 1 to 4194304");
  }
  if (o.kv_pool && o.weight_cache == "off") {
    return InvalidArgument("--kv-pool maps the KV pool each rank's holder makes: pass --weight-cache daemon or "
                           "client with --socket, or drop --kv-pool");
  }
  if (o.kv_scratch_mib < 1 || o.kv_scratch_mib > (1 << 20)) {
    return InvalidArgument("--kv-scratch-mib " + std::to_string(o.kv_scratch_mib) + " is out of range; pass 1 to 1048576");
  }
  if (o.dequant_scratch_mib < 1 || o.dequant_scratch_mib > 65536) {
    return InvalidArgument("--dequant-scratch-mib " + std::to_string(o.dequant_scratch_mib) +
                           " is out of range; pass 1 to 65536");
  }
  if (o.matmul != "split" && o.matmul != "bf16") {
    return InvalidArgument("--matmul '" + o.matmul +
                           "' is not a mode: pass split (activations as two bfloat16 terms on tensor cores, close to "
                           "float32; the default) or bf16 (one term, about twice as fast)");
  }
  if (o.nccl_max_ctas < 0 || o.nccl_max_ctas > 64) {
    return InvalidArgument("--nccl-max-ctas " + std::to_string(o.nccl_max_ctas) + " is out of range; pass 0 to 64");
  }
  if (o.comm_keepalive_ms < 1) return InvalidArgument("--comm-keepalive-ms must be at least 1");
  if (o.kv_adopt_wait_ms < 0 || o.kv_adopt_wait_ms > 600'000) {
    return InvalidArgument("--kv-adopt-wait-ms " + std::to_string(o.kv_adopt_wait_ms) +
                           " is out of range; pass 0 (no wait) to 600000");
  }
  if (o.kv_adopt_keep_ms < 0 || o.kv_adopt_keep_ms > 3'600'000) {
    return InvalidArgument("--kv-adopt-keep-ms " + std::to_string(o.kv_adopt_keep_ms) +
                           " is out of range; pass 0 (free them at once) to 3600000");
  }
  if (o.min_step_ms < 0 || o.min_step_ms > 10'000) {
    return InvalidArgument("--min-step-ms " + std::to_string(o.min_step_ms) +
                           " is out of range; pass 0 (off) to 10000");
  }
  if (o.max_step_ms < -1 || o.max_step_ms > 60'000) {
    return InvalidArgument("--max-step-ms " + std::to_string(o.max_step_ms) +
                           " is out of range; pass 0 (off) to 60000, or leave it out for the backend's default");
  }
  if (o.max_batch < 1) return InvalidArgument("--max-batch must be at least 1");
  if (o.threads < 0) return InvalidArgument("--threads must be 0 (automatic) or more");
  if (o.block_size < 1 || o.block_size > 1024) return InvalidArgument("--kv-block-size must be 1 to 1024");
  if (o.header_timeout_ms < 1 || o.idle_timeout_ms < 1) return InvalidArgument("HTTP timeouts must be at least 1 ms");
  return Status::Ok();
}

int EngineEpSize(const EngineOptions& opts, int tp) { return opts.expert_parallel ? tp : opts.ep_size; }

}  // namespace wsup::engine
