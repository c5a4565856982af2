#include "supervisor/cache_commands.h"

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "client/client.h"
#include "common/sha256.h"

namespace wsup {

using nlohmann::json;

namespace {

std::string Dump(const json& j, bool pretty) {
  return j.dump(pretty ? 2 : -1, ' ', false, json::error_handler_t::replace) + "\n";
}

CommandOutput Failure(const char* command, const Error& e, bool as_json) {
  CommandOutput o;
  o.exit_code = kCacheExitError;
  if (as_json) {
    o.out = Dump({{"ok", false}, {"error", e.ToString()}}, true);
  } else {
    o.err = std::string("wsup cache ") + command + ": " + e.ToString() + "\n";
  }
  return o;
}

// A short stable id of a fingerprint, to compare holders at a glance.
std::string FingerprintId(const Fingerprint& fp) {
  std::string canon;
  for (const auto& [k, v] : fp.fields()) canon += k + "=" + v + "\n";
  return Sha256Hex(canon).substr(0, 16);
}

std::string HumanBytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

Result<int> IntField(const Fingerprint& fp, const char* field) {
  std::string v = fp.Get(field);
  try {
    size_t used = 0;
    int n = std::stoi(v, &used);
    if (used == v.size()) return n;
  } catch (const std::exception&) {
  }
  return Corrupt(std::string("the holder's fingerprint field '") + field + "' is '" + v +
                 "', not a number; the holder is from another wsup version: restart it");
}

}  // namespace

CommandOutput CacheInfoCommand(const std::string& socket_path, bool as_json, int timeout_ms) {
  auto info = QueryHolderInfo(socket_path, timeout_ms);
  if (!info.ok()) return Failure("info", info.error(), as_json);
  const InfoMsg& m = *info;
  CommandOutput o;
  if (as_json) {
    json j = EncodeInfo(m);
    j.erase("type");
    j["fingerprint_id"] = FingerprintId(m.fingerprint);
    for (size_t i = 0; i < m.layouts.size() && i < j["layouts"].size(); ++i) {
      j["layouts"][i]["fingerprint_id"] = FingerprintId(m.layouts[i].fingerprint);
    }
    j["ok"] = true;
    o.out = Dump(j, true);
    return o;
  }
  std::string s;
  s += "holder       " + m.socket + " (pid " + std::to_string(m.holder_pid) + ")" +
       (m.adopted ? ", started from kept fds" : "") + "\n";
  if (!m.deployment.empty()) s += "deployment   " + m.deployment + "\n";
  if (!m.revision.empty()) s += "revision     " + m.revision + "\n";
  s += "backend      " + m.backend;
  if (m.backend == "cuda") s += " (device " + std::to_string(m.device) + ", " + m.device_uuid + ")";
  s += "\n";
  s += "tensors      " + std::to_string(m.tensors) + "\n";
  s += "bytes        " + std::to_string(m.bytes) + " (" + HumanBytes(m.bytes) + "; arena " +
       HumanBytes(m.arena_bytes) + ")\n";
  s += "allocations  " + std::to_string(m.allocations) + "\n";
  s += "clients      " + std::to_string(m.clients) + " attached, " + std::to_string(m.connections) +
       " connections";
  if (m.attaches > 0) s += " (" + std::to_string(m.attaches) + " attaches since start)";
  s += "\n";
  for (const ClientEntry& c : m.client_list) {
    s += "  " + (c.name.empty() ? std::string("(unnamed)") : c.name) + "  role=" + c.role +
         " pid=" + std::to_string(c.pid) + (c.attached ? " attached" : "") + "\n";
  }
  if (m.clients_unlisted > 0) s += "  (" + std::to_string(m.clients_unlisted) + " more not listed)\n";
  if (m.max_connections > 0) {
    // Attached engines keep their mapping when the holder closes their idle
    // connection, so an engine that serves may be missing from the list.
    s += "limits       " + std::to_string(m.max_connections) + " connections; idle ones closed after " +
         std::to_string(m.idle_timeout_ms) + " ms (" + std::to_string(m.closed_idle) + " so far, " +
         std::to_string(m.evicted) + " early to make room)\n";
  }
  if (m.kv_pool) {
    s += "kv pool      " + m.kv_pool->id + ", " + std::to_string(m.kv_pool->bytes) + " bytes (" +
         HumanBytes(m.kv_pool->bytes) + ") in " + std::to_string(m.kv_pool->allocations) + " allocations" +
         (m.kv_pool->adopted ? ", adopted from kept fds" : "") + "\n";
  } else {
    s += "kv pool      none (wsup-holder --kv-pool-mib, [kv] pool_mib)\n";
  }
  s += "fingerprint  " + FingerprintId(m.fingerprint) + "\n";
  for (const auto& [k, v] : m.fingerprint.fields()) s += "  " + k + ": " + v + "\n";
  if (m.layout == "engine") {
    // A holder of engine-made layouts: one per fingerprint.
    s += "layouts      " + std::to_string(m.layouts.size()) + " (engine-made)\n";
    s += "layout bytes " + std::to_string(m.layout_bytes) + " (" + HumanBytes(m.layout_bytes) + ") granted, cap " +
         (m.layout_max_bytes > 0 ? std::to_string(m.layout_max_bytes) + " (" + HumanBytes(m.layout_max_bytes) + ")"
                                 : std::string("none")) +
         " (weight_cache.layout_max_bytes)\n";
    for (const LayoutInfo& l : m.layouts) {
      s += "  layout " + std::to_string(l.id) + "  " + l.state + "  " + std::to_string(l.tensors) + " tensors, " +
           HumanBytes(l.bytes) + " in " + std::to_string(l.allocations) + " allocations";
      if (l.state == "writing") {
        s += ", writer " + l.writer + " (pid " + std::to_string(l.writer_pid) + ")";
        if (l.waiters > 0) s += ", " + std::to_string(l.waiters) + " waiting";
      } else {
        s += ", " + std::to_string(l.attaches) + " attaches, hash " + l.layout_hash.substr(0, 16);
        if (l.adopted) s += ", adopted from kept fds";
      }
      s += "\n    fingerprint " + FingerprintId(l.fingerprint) + ": engine " + l.fingerprint.Get("engine") + " " +
           l.fingerprint.Get("engine_version") + ", transform " + l.fingerprint.Get("transform") + ", revision '" +
           l.fingerprint.Get("revision") + "', tp rank " + l.fingerprint.Get("tp_rank") + "\n";
    }
  }
  o.out = s;
  return o;
}

CommandOutput CacheVerifyCommand(const std::string& socket_path, const std::string& model_dir, bool as_json,
                                 int timeout_ms) {
  auto t0 = std::chrono::steady_clock::now();
  auto att = AttachInspect(socket_path, "wsup cache verify", timeout_ms);
  if (!att.ok()) return Failure("verify", att.error(), as_json);
  const Attachment& a = **att;
  const Fingerprint& holder_fp = a.holder_fingerprint();

  // The rank's slice is what the holder keeps, so plan the same slice.
  auto tp_size = IntField(holder_fp, "tp_size");
  if (!tp_size.ok()) return Failure("verify", tp_size.error(), as_json);
  auto tp_rank = IntField(holder_fp, "tp_rank");
  if (!tp_rank.ok()) return Failure("verify", tp_rank.error(), as_json);
  auto ckpt = Checkpoint::Open(model_dir);
  if (!ckpt.ok()) return Failure("verify", ckpt.error(), as_json);
  // Absent in fingerprints from before expert parallelism: no EP.
  auto int_or = [&](const char* f, int d) {
    auto v = IntField(holder_fp, f);
    return v.ok() ? *v : d;
  };
  ShardSpec spec{*tp_size, *tp_rank, int_or("ep_size", 1), int_or("ep_rank", 0)};
  auto shards = PlanShards(*ckpt, spec);
  if (!shards.ok()) return Failure("verify", shards.error().With(model_dir), as_json);

  // Our fingerprint, with the deployment inputs taken from the holder's:
  // what differs is then only what the folder on disk says.
  FingerprintInputs in;
  in.model_path = AbsoluteModelPath(model_dir);
  in.revision = holder_fp.Get("revision");
  in.shard = spec;
  in.pp_size = int_or("pp_size", 1);
  in.pp_rank = int_or("pp_rank", 0);
  in.dp_size = int_or("dp_size", 1);
  in.backend = holder_fp.Get("backend");
  in.device_capability = holder_fp.Get("device_capability");
  in.cuda_driver = holder_fp.Get("cuda_driver");
  in.cuda_runtime = holder_fp.Get("cuda_runtime");
  Fingerprint ours = Fingerprint::Compute(*ckpt, in);
  std::vector<FingerprintDiff> fp_diffs = ours.Compare(holder_fp);

  std::unordered_map<std::string_view, const ShardedTensor*> planned;
  for (const ShardedTensor& t : *shards) planned.emplace(t.name, &t);

  json mismatched = json::array();
  json details = json::array();
  json missing = json::array();
  uint64_t verified = 0, bytes_compared = 0;
  std::vector<uint8_t> resident, on_disk;
  std::unordered_map<std::string_view, bool> seen;
  for (const ManifestEntry& e : a.manifest().entries) {
    seen.emplace(e.name, true);
    auto it = planned.find(e.name);
    auto fail = [&](const std::string& why) {
      mismatched.push_back(e.name);
      details.push_back({{"name", e.name}, {"reason", why}});
    };
    if (it == planned.end()) {
      fail("resident but not in the checkpoint");
      continue;
    }
    const ShardedTensor& t = *it->second;
    if (e.dtype != DTypeName(t.dtype) || e.shape != t.shape || e.nbytes != t.nbytes) {
      fail("resident as " + e.dtype + json(e.shape).dump() + ", the checkpoint's slice is " + DTypeName(t.dtype) +
           json(t.shape).dump());
      continue;
    }
    resident.resize(e.nbytes);
    on_disk.resize(t.nbytes);
    Status s = a.arena().CopyToHost(e, resident.data());
    if (!s.ok()) return Failure("verify", s.error().With("tensor '" + e.name + "'"), as_json);
    s = ReadShard(*ckpt, t, on_disk.data());
    if (!s.ok()) return Failure("verify", s.error(), as_json);
    bytes_compared += e.nbytes;
    if (std::memcmp(resident.data(), on_disk.data(), e.nbytes) != 0) {
      size_t first = 0;
      while (first < e.nbytes && resident[first] == on_disk[first]) ++first;
      fail("bytes differ from the checkpoint, first at byte " + std::to_string(first));
      continue;
    }
    ++verified;
  }
  for (const ShardedTensor& t : *shards) {
    if (!seen.count(t.name)) missing.push_back(t.name);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool ok = mismatched.empty() && missing.empty();

  CommandOutput o;
  o.exit_code = ok ? kCacheExitOk : kCacheExitMismatch;
  if (as_json) {
    json j = {{"ok", ok},
              {"socket", socket_path},
              {"model", AbsoluteModelPath(model_dir)},
              {"holder_model_path", holder_fp.Get("model_path")},
              {"tensors", a.manifest().entries.size()},
              {"verified", verified},
              {"mismatched", mismatched},
              {"missing", missing},
              {"details", details},
              {"bytes_compared", bytes_compared},
              {"fingerprint_diffs", DiffsToJson(fp_diffs)},
              {"seconds", seconds}};
    o.out = Dump(j, true);
    return o;
  }
  std::string s;
  s += "verified " + std::to_string(verified) + " of " + std::to_string(a.manifest().entries.size()) +
       " resident tensors (" + HumanBytes(bytes_compared) + ") against " + AbsoluteModelPath(model_dir) + "\n";
  for (const auto& d : details) {
    s += "  MISMATCH " + d["name"].get<std::string>() + ": " + d["reason"].get<std::string>() + "\n";
  }
  for (const auto& n : missing) s += "  MISSING  " + n.get<std::string>() + ": in the checkpoint, not resident\n";
  if (!fp_diffs.empty()) {
    s += "fingerprint differences (reported, not refused): " + Fingerprint::DescribeDiffs(fp_diffs) + "\n";
  }
  s += ok ? "OK\n"
          : "FAILED: the holder's weights differ from the checkpoint; restart the holder from the right "
            "checkpoint (its fds may have been adopted from a different one)\n";
  o.out = s;
  return o;
}

}  // namespace wsup
