// The C ABI's KV pool and journal (client/wsup_client.h, "The node's KV
// pool and its journal"): the pool's fds fetched from the holder on a handle
// of their own, and the journal's token hash.

#include <cstddef>
#include <cstdint>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "client/c_api_handle.h"
#include "client/kv_pool.h"
#include "client/wsup_client.h"
#include "wire/kv_journal.h"

struct wsup_kv_pool {
  int status = WSUP_OK;
  std::string error;
  std::string json = "{}";
  wsup::KvPoolFds pool;
};

static_assert(WSUP_KV_TOKEN_HASH_SEED == wsup::kTokenHashSeed, "wsup_client.h states the journal's seed");

using nlohmann::json;
using wsup::capi::StatusCode;

extern "C" {

wsup_kv_pool* wsup_kv_pool_fetch(const char* socket_path, int timeout_ms) {
  wsup_kv_pool* p = nullptr;
  try {
    p = new wsup_kv_pool();
    if (socket_path == nullptr || *socket_path == '\0' || timeout_ms <= 0) {
      p->status = WSUP_ERR_INVALID_ARGUMENT;
      p->error = "wsup_kv_pool_fetch: give the holder's socket path and a timeout_ms above 0";
      return p;
    }
    auto fetched = wsup::FetchKvPool(socket_path, timeout_ms);
    if (!fetched.ok()) {
      p->status = StatusCode(fetched.error().code());
      p->error = fetched.error().ToString();
      return p;
    }
    p->pool = std::move(*fetched);
    p->json = json{{"id", p->pool.pool.id},
                   {"backend", p->pool.pool.backend},
                   {"device", p->pool.pool.device},
                   {"allocations", p->pool.pool.allocations}}
                  .dump();
  } catch (const std::bad_alloc&) {
    if (p != nullptr) {
      p->status = WSUP_ERR_INTERNAL;
      p->error = "out of memory";
    }
  } catch (...) {
    if (p != nullptr) {
      p->status = WSUP_ERR_INTERNAL;
      p->error = "unexpected exception";
    }
  }
  return p;
}

int wsup_kv_pool_status(const wsup_kv_pool* p) { return p ? p->status : WSUP_ERR_INVALID_ARGUMENT; }

const char* wsup_kv_pool_error(const wsup_kv_pool* p) {
  return p ? p->error.c_str() : "wsup_kv_pool_error: the handle is NULL";
}

const char* wsup_kv_pool_json(const wsup_kv_pool* p) { return p ? p->json.c_str() : "{}"; }

size_t wsup_kv_pool_allocations(const wsup_kv_pool* p) { return p ? p->pool.fds.size() : 0; }

int wsup_kv_pool_fd(const wsup_kv_pool* p, size_t i) {
  return p && i < p->pool.fds.size() ? p->pool.fds[i].get() : -1;
}

uint64_t wsup_kv_pool_allocation_bytes(const wsup_kv_pool* p, size_t i) {
  return p && i < p->pool.pool.allocations.size() ? p->pool.pool.allocations[i] : 0;
}

void wsup_kv_pool_release(wsup_kv_pool* p) { delete p; }

uint64_t wsup_kv_token_hash(const int32_t* ids, size_t n, uint64_t seed) {
  return ids == nullptr ? seed : wsup::TokenHash(ids, n, seed);
}

}  // extern "C"
