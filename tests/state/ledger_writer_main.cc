// Test helper for the ledger's crash-safety test: writes failovers (each with
// a recovery and a cache event) in a loop and prints each failover id to
// stdout only after Flush() has returned, i.e. after the rows are committed.
// The test SIGKILLs it at arbitrary moments.
//
// Usage: ledger_writer DB_PATH
#include <cstdio>
#include <string>
#include <utility>

#include "common/clock.h"
#include "state/ledger.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ledger_writer DB_PATH\n");
    return 2;
  }
  auto ledger = wsup::Ledger::Open(argv[1]);
  if (!ledger.ok()) {
    std::fprintf(stderr, "ledger_writer: %s\n", ledger.error().ToString().c_str());
    return 1;
  }
  for (int64_t n = 0;; ++n) {
    int64_t now = wsup::RealClock().WallMs();
    // Built in one initializer: assigning literals to the fields one by one
    // gives a false -Wrestrict error from GCC 12 at -O3 (the Release build).
    const char* trigger = n % 3 == 0 ? "crash" : n % 3 == 1 ? "probe" : "drill";
    std::string reason = "crash-safety test row ";
    reason += std::to_string(n);
    wsup::FailoverRecord f{.trigger = trigger,
                           .reason = std::move(reason),
                           .drill = n % 3 == 2,
                           .from_slot = "a",
                           .to_slot = "b",
                           .fault_ms = now - 30,
                           .detected_ms = now - 20,
                           .swapped_ms = now - 10};
    auto id = (*ledger)->RecordFailover(f);
    if (!id.ok()) return 1;
    wsup::RecoveryRecord r;
    r.failover_id = *id;
    r.slot = "a";
    r.cause = f.trigger;
    r.fault_ms = f.fault_ms;
    r.ready_ms = now;
    r.cache_result = "hit";
    r.phases_json = R"({"attach_ms": 3})";
    if (!(*ledger)->RecordRecovery(r).ok()) return 1;
    wsup::CacheEventRecord c;
    c.time_ms = now;
    c.slot = "a";
    c.result = "hit";
    c.mode = "daemon";
    c.attach_ms = 3;
    if (!(*ledger)->RecordCacheEvent(c).ok()) return 1;
    if (!(*ledger)->SetFailoverFirstOk(*id, now + 1).ok()) return 1;
    wsup::Status st = (*ledger)->Flush();
    if (!st.ok()) {
      std::fprintf(stderr, "ledger_writer: %s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("%lld\n", static_cast<long long>(*id));
    std::fflush(stdout);
  }
}
