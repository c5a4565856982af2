#include "engine/kv_pool_link.h"

#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include <chrono>

#include "client/kv_pool.h"
#include "common/json_limits.h"

namespace wsup::engine {

using nlohmann::json;

Result<RoleRequest> ParseRoleRequest(const std::string& body) {
  auto parsed = ParseJsonChecked(body, "the /wsup/role body", R"(send {"role": "active", "kv": "pool"})");
  if (!parsed.ok()) return parsed.error();
  const json& j = *parsed;
  if (!j.is_object() || !j.contains("role") || !j["role"].is_string()) {
    return InvalidArgument(R"(the /wsup/role body needs "role": "active" or "standby")");
  }
  RoleRequest r;
  r.role = j["role"].get<std::string>();
  if (r.role != "active" && r.role != "standby") {
    return InvalidArgument("role '" + r.role.substr(0, 32) + "' is not one of active, standby");
  }
  std::string kv = "scratch";
  if (j.contains("kv")) {
    if (!j["kv"].is_string()) return InvalidArgument(R"("kv" must be "pool" or "scratch")");
    kv = j["kv"].get<std::string>();
  }
  if (kv != "pool" && kv != "scratch") return InvalidArgument("kv '" + kv.substr(0, 32) + "' is not one of pool, scratch");
  if (kv == "pool" && r.role != "active") {
    return InvalidArgument(R"(only the active engine maps the KV pool: send "kv": "scratch" with role standby)");
  }
  r.pool = kv == "pool";
  return r;
}

Result<std::vector<std::vector<uint64_t>>> KvPoolLink::Describe() {
  std::vector<std::vector<uint64_t>> out;
  std::string id;
  for (size_t r = 0; r < sockets_.size(); ++r) {
    auto pool = FetchKvPool(sockets_[r], timeout_ms_);
    if (!pool.ok()) {
      return pool.error().With("--kv-pool: rank " + std::to_string(r) +
                               "'s holder (start it with --kv-pool-mib, or the node with [kv] pool_mib)");
    }
    if (r == 0) id = pool->pool.id;
    out.push_back(pool->pool.allocations);
  }
  allocations_ = out;
  std::lock_guard<std::mutex> lk(mu_);
  pool_id_ = id;
  return out;
}

Result<PoolFds> KvPoolLink::Fetch() {
  std::vector<std::vector<UniqueFd>> out;
  std::string id;
  for (size_t r = 0; r < sockets_.size(); ++r) {
    WSUP_ASSIGN_OR_RETURN(KvPoolFds pool, FetchKvPool(sockets_[r], timeout_ms_));
    if (r < allocations_.size() && pool.pool.allocations != allocations_[r]) {
      return Mismatch("rank " + std::to_string(r) + "'s KV pool is not laid out as it was when this engine started (" +
                      std::to_string(pool.pool.bytes()) + " bytes in " + std::to_string(pool.pool.allocations.size()) +
                      " allocations now); restart the engine so that it lays its blocks out over the new pool");
    }
    if (r == 0) id = pool.pool.id;
    out.push_back(std::move(pool.fds));
  }
  std::lock_guard<std::mutex> lk(mu_);
  pool_id_ = id;
  return out;
}

PoolPrefetch::~PoolPrefetch() {
  if (thread_.joinable()) thread_.join();
}

void PoolPrefetch::Start(Prepare prepare) {
  std::unique_lock<std::mutex> lk(mu_);
  if (in_flight_ || kept_) return;
  in_flight_ = true;
  const uint64_t gen = generation_;
  // The last prefetch is over (not in flight): joining it does not block.
  std::thread previous = std::move(thread_);
  lk.unlock();
  if (previous.joinable()) previous.join();
  lk.lock();
  thread_ = std::thread([this, gen, prepare = std::move(prepare)] {
    const auto t0 = std::chrono::steady_clock::now();
    auto fds = fetch_();
    const auto t1 = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> g(mu_);
    // Prepared under the lock, so that a Discard() either comes first (and
    // nothing is prepared) or after (and drops it).
    if (gen != generation_) {
      // Discarded while fetching: the fds close here.
    } else if (!fds.ok()) {
      spdlog::warn("KV pool: fetching it ahead of its grant: {}; it is fetched at the grant", fds.error().ToString());
    } else if (Status st = prepare(*fds); !st.ok()) {
      spdlog::warn("KV pool: importing it ahead of its grant: {}; it is imported at the grant", st.ToString());
    } else {
      kept_ = std::move(*fds);
      // Said once per promotion: how long the fetch and the import took,
      // which run beside the first requests the engine serves.
      const auto t2 = std::chrono::steady_clock::now();
      auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
      spdlog::info("KV pool fetched and imported ahead of its grant in {:.2f} ms (fetch {:.2f}, import {:.2f})",
                   ms(t0, t2), ms(t0, t1), ms(t1, t2));
    }
    in_flight_ = false;
    cv_.notify_all();
  });
}

Result<PoolFds> PoolPrefetch::Take(bool* prefetched) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return !in_flight_; });
    if (kept_) {
      PoolFds out = std::move(*kept_);
      kept_.reset();
      *prefetched = true;
      return out;
    }
  }
  *prefetched = false;
  return fetch_();
}

void PoolPrefetch::Discard(const Drop& drop) {
  std::lock_guard<std::mutex> lk(mu_);
  ++generation_;
  kept_.reset();
  drop();
}

std::string KvPoolLink::pool_id() const {
  std::lock_guard<std::mutex> lk(mu_);
  return pool_id_;
}

}  // namespace wsup::engine
