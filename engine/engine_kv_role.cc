// POST /wsup/role (engine/engine.h): the supervisor's word on this
// engine's role and the node's KV pool (engine/kv_pool_link.h), and the
// "kv" JSON its answer and GET /wsup/status share.
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace wsup::engine {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

void Engine::HandleRole(const std::shared_ptr<http::ResponseWriter>& w) {
  if (!ready()) {
    SendError(w, 503, std::string("the engine is ") + state_name() + "; give it a role once GET /wsup/status says ready",
              "unavailable_error", {{"Retry-After", "1"}});
    return;
  }
  auto req = ParseRoleRequest(w->request().body);
  if (!req.ok()) {
    SendError(w, 400, req.error().message(), "invalid_request_error");
    return;
  }
  role_ = req->role;
  auto answer = [this, w, role = req->role](const Status& st) {
    json j{{"role", role}, {"kv", KvJson()}};
    if (!st.ok()) {
      j["error"] = st.error().message();
      w->Send(http::HttpResponse::Json(409, j.dump()));
      return;
    }
    w->Send(http::HttpResponse::Json(200, j.dump()));
  };
  if (!pool_link_) {
    answer(Status::Ok());  // a private cache: the role changes nothing of it
    return;
  }
  const auto t0 = Clock::now();
  if (req->pool) {
    KvPoolLink* link = pool_link_.get();
    ModelRunner* runner = runner_.get();
    // Filled on the mapping thread (the fetch, then the done callback).
    auto parts = std::make_shared<PoolMapParts>();
    scheduler_->OpenPool(
        [link, parts] {
          const auto f0 = Clock::now();
          auto fds = link->Take(&parts->prefetched);
          parts->fetch_ms = MsSince(f0);
          return fds;
        },
        [this, answer, t0, runner, parts](Status st) {
          const double ms = MsSince(t0);
          const int64_t at = WallMs();
          parts->times = runner->last_kv_map_times();
          OnLoop([this, answer, st, ms, at, parts] {
            if (st.ok()) {
              pool_mapped_at_ms_ = at;
              pool_map_ms_ = ms;
              pool_map_parts_ = *parts;
              spdlog::info("KV pool {} mapped in {:.2f} ms ({} {:.2f} ms, import {:.2f}, map {:.2f}, access {:.2f}): "
                           "this engine is its owner",
                           pool_link_->pool_id(), ms, parts->prefetched ? "prefetched; take" : "fetch",
                           parts->fetch_ms, parts->times.import_ms, parts->times.map_ms, parts->times.access_ms);
            } else {
              spdlog::error("KV pool: not mapped: {}", st.ToString());
            }
            answer(st);
          });
        });
  } else {
    ModelRunner* runner = runner_.get();
    if (req->role == "active") {
      // Promoted while another engine may still write the pool: serve from
      // the scratch, with the pool's fds and import ready for the grant.
      pool_link_->Prefetch([runner](const PoolFds& fds) { return runner->PrepareKvPool(fds); });
    } else {
      pool_link_->Discard([runner] { runner->DropPreparedKvPool(); });
    }
    scheduler_->ClosePool([this, answer](Status st) {
      const int64_t at = WallMs();
      OnLoop([this, answer, st, at] {
        if (st.ok()) {
          pool_released_at_ms_ = at;
          spdlog::info("KV pool let go: this engine serves from its scratch");
        } else {
          spdlog::error("KV pool: not let go: {}", st.ToString());
        }
        answer(st);
      });
    });
  }
}

json Engine::KvJson() {
  const KvLayout& kv = runner_->kv_layout();
  SchedulerStats s = scheduler_->stats();
  json j;
  const uint64_t pool_now = s.pool_mapped ? kv.pool_bytes() : 0;
  j["source"] = !kv.pooled() ? "private" : s.pool_mapped ? "pool" : "scratch";
  j["bytes"] = kv.scratch_bytes() + pool_now;
  j["scratch_bytes"] = kv.scratch_bytes();
  j["block_size"] = kv.block_size;
  j["blocks"] = s.total_blocks;
  j["free_blocks"] = s.free_blocks;
  if (kv.pooled()) {
    j["pool_bytes"] = kv.pool_bytes();
    j["pool_id"] = pool_link_ ? pool_link_->pool_id() : "";
    j["pool_mapped"] = s.pool_mapped;
    j["pool_closing"] = s.pool_closing;
    j["pool_blocks_in_use"] = s.pool_blocks_in_use;
    // The journal of this engine's sequences in the pool (docs/kv_journal.md).
    j["journal"] = {{"on", s.journal},
                    {"blocks", s.journal_blocks},
                    {"entries", s.journal_entries},
                    {"found_at_open", s.journal_found},
                    {"writes", s.journal_writes},
                    {"write_errors", s.journal_errors}};
    j["mapped_at_ms"] = pool_mapped_at_ms_;
    j["released_at_ms"] = pool_released_at_ms_;
    j["map_ms"] = pool_map_ms_;
    // The last mapping by part: fetching the fds (or taking them, fetched
    // ahead), importing, mapping, granting access.
    j["map_parts"] = {{"prefetched", pool_map_parts_.prefetched},
                      {"imported_ahead", pool_map_parts_.times.prepared},
                      {"fetch_ms", pool_map_parts_.fetch_ms},
                      {"import_ms", pool_map_parts_.times.import_ms},
                      {"map_ms", pool_map_parts_.times.map_ms},
                      {"access_ms", pool_map_parts_.times.access_ms}};
  }
  return j;
}

}  // namespace wsup::engine
