#include "state/report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <map>
#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>

#include "state/schema.h"

namespace wsup {

Result<int64_t> ParseDuration(std::string_view text) {
  const std::string allowed = "; write a number and a unit: ms, s, m, h, d or w (e.g. 10m, 2h, 7d)";
  std::string s(text);
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0) return InvalidArgument("duration \"" + s + "\" does not start with a number" + allowed);
  if (i > 12) return InvalidArgument("duration \"" + s + "\" is too long" + allowed);
  int64_t n = std::stoll(s.substr(0, i));
  std::string unit = s.substr(i);
  int64_t scale = 0;
  if (unit == "ms") scale = 1;
  else if (unit == "s") scale = 1000;
  else if (unit == "m") scale = 60'000;
  else if (unit == "h") scale = 3'600'000;
  else if (unit == "d") scale = 86'400'000;
  else if (unit == "w") scale = 7 * 86'400'000LL;
  else if (unit.empty()) return InvalidArgument("duration \"" + s + "\" has no unit" + allowed);
  else return InvalidArgument("duration \"" + s + "\" has the unknown unit \"" + unit + "\"" + allowed);
  if (n > INT64_MAX / scale) return InvalidArgument("duration \"" + s + "\" is too large" + allowed);
  return n * scale;
}

Result<LedgerReader> LedgerReader::Open(const std::string& path) {
  LedgerReader r;
  WSUP_ASSIGN_OR_RETURN(r.db_, Db::Open(path, /*create=*/false));
  WSUP_RETURN_IF_ERROR(r.db_.Exec("PRAGMA busy_timeout = 5000"));
  WSUP_ASSIGN_OR_RETURN(int version, SchemaVersion(r.db_));
  if (version == 0)
    return NotFound(path + ": not a wsup ledger (schema version 0, no tables); point at <state_dir>/wsup.db "
                           "of a node that has run the supervisor");
  if (version < kSchemaVersion) WSUP_RETURN_IF_ERROR(Migrate(r.db_));
  if (version > kSchemaVersion) WSUP_RETURN_IF_ERROR(Migrate(r.db_));  // refuses, naming both versions
  return r;
}

namespace {

// One column of a ledger table and the record member it fills. A reader
// names each column once, beside its member, so the SELECT list and the
// reading of each row cannot drift apart.
template <typename T>
struct Column {
  const char* name;
  std::variant<int64_t T::*, std::optional<int64_t> T::*, std::string T::*, bool T::*, int T::*> member;
};

void Fill(const Stmt& st, int col, int64_t& v) { v = st.Int(col); }
void Fill(const Stmt& st, int col, std::optional<int64_t>& v) { v = st.OptInt(col); }
void Fill(const Stmt& st, int col, std::string& v) { v = st.Text(col); }
void Fill(const Stmt& st, int col, bool& v) { v = st.Int(col) != 0; }
void Fill(const Stmt& st, int col, int& v) { v = static_cast<int>(st.Int(col)); }

// The rows of `table` whose `time` column is at least since_ms, oldest
// first (ties by id), each column into its member.
template <typename T, size_t N>
Result<std::vector<T>> ReadTable(Db& db, const char* table, const char* time, const Column<T> (&columns)[N],
                                 int64_t since_ms) {
  std::string sql = "SELECT ";
  for (size_t i = 0; i < N; ++i) sql += std::string(i ? ", " : "") + columns[i].name;
  sql += std::string(" FROM ") + table + " WHERE " + time + " >= ?1 ORDER BY " + time + ", id";
  WSUP_ASSIGN_OR_RETURN(Stmt st, db.Prepare(sql));
  st.Bind(1, since_ms);
  std::vector<T> out;
  for (;;) {
    WSUP_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    T r;
    for (size_t i = 0; i < N; ++i) {
      std::visit([&](auto member) { Fill(st, static_cast<int>(i), r.*member); }, columns[i].member);
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

Result<std::vector<FailoverRecord>> LedgerReader::Failovers(int64_t since_ms) {
  using R = FailoverRecord;
  static const Column<R> kColumns[] = {
      {"id", &R::id},
      {"trigger", &R::trigger},
      {"reason", &R::reason},
      {"drill", &R::drill},
      {"from_slot", &R::from_slot},
      {"to_slot", &R::to_slot},
      {"fault_ms", &R::fault_ms},
      {"detected_ms", &R::detected_ms},
      {"swapped_ms", &R::swapped_ms},
      {"first_ok_ms", &R::first_ok_ms},
      {"detect_ms", &R::detect_ms},
      {"swap_ms", &R::swap_ms},
      {"failover_ms", &R::failover_ms},
      {"outage_ms", &R::outage_ms},
      {"reconstructed", &R::reconstructed},
      {"kv_full_ms", &R::kv_full_ms},
      {"kv_back_ms", &R::kv_back_ms},
      {"gone_ms", &R::gone_ms},
  };
  return ReadTable(db_, "failovers", "fault_ms", kColumns, since_ms);
}

Result<std::vector<CacheEventRecord>> LedgerReader::CacheEvents(int64_t since_ms) {
  using R = CacheEventRecord;
  static const Column<R> kColumns[] = {
      {"id", &R::id},
      {"time_ms", &R::time_ms},
      {"slot", &R::slot},
      {"rank", &R::rank},
      {"result", &R::result},
      {"mode", &R::mode},
      {"miss_reason", &R::miss_reason},
      {"diff_json", &R::diff_json},
      {"attach_ms", &R::attach_ms},
      {"load_ms", &R::load_ms},
  };
  return ReadTable(db_, "cache_events", "time_ms", kColumns, since_ms);
}

Result<std::vector<RecoveryRecord>> LedgerReader::Recoveries(int64_t since_ms) {
  using R = RecoveryRecord;
  static const Column<R> kColumns[] = {
      {"id", &R::id},
      {"failover_id", &R::failover_id},
      {"slot", &R::slot},
      {"cause", &R::cause},
      {"fault_ms", &R::fault_ms},
      {"ready_ms", &R::ready_ms},
      {"cache_result", &R::cache_result},
      {"cache_reason", &R::cache_reason},
      {"phases_json", &R::phases_json},
      {"recovery_ms", &R::recovery_ms},
  };
  return ReadTable(db_, "recoveries", "fault_ms", kColumns, since_ms);
}

Result<std::vector<HolderRestartRecord>> LedgerReader::HolderRestarts(int64_t since_ms) {
  using R = HolderRestartRecord;
  static const Column<R> kColumns[] = {
      {"id", &R::id},         {"time_ms", &R::time_ms},   {"rank", &R::rank},
      {"reason", &R::reason}, {"from_fds", &R::from_fds}, {"restart_ms", &R::restart_ms},
  };
  return ReadTable(db_, "holder_restarts", "time_ms", kColumns, since_ms);
}

Result<std::vector<ProbeTransitionRecord>> LedgerReader::ProbeTransitions(int64_t since_ms) {
  using R = ProbeTransitionRecord;
  static const Column<R> kColumns[] = {
      {"id", &R::id},
      {"time_ms", &R::time_ms},
      {"slot", &R::slot},
      {"from_state", &R::from_state},
      {"to_state", &R::to_state},
      {"cause", &R::cause},
  };
  return ReadTable(db_, "probe_transitions", "time_ms", kColumns, since_ms);
}

Result<std::vector<FenceRecord>> LedgerReader::Fences(int64_t since_ms) {
  using R = FenceRecord;
  static const Column<R> kColumns[] = {
      {"id", &R::id},
      {"time_ms", &R::time_ms},
      {"slot", &R::slot},
      {"pid", &R::pid},
      {"slot_state", &R::slot_state},
      {"kind", &R::kind},
      {"pool_owner", &R::pool_owner},
      {"reason", &R::reason},
  };
  return ReadTable(db_, "fences", "time_ms", kColumns, since_ms);
}

Result<LedgerLosses> LedgerReader::Losses() { return ReadLosses(db_.path()); }

Result<std::vector<RolloutRecord>> LedgerReader::Rollouts(int64_t since_ms) {
  using R = RolloutRecord;
  static const Column<R> kColumns[] = {
      {"id", &R::id},
      {"started_ms", &R::started_ms},
      {"ended_ms", &R::ended_ms},
      {"outcome", &R::outcome},
      {"reason", &R::reason},
      {"command_before", &R::command_before},
      {"command_after", &R::command_after},
      {"steps_json", &R::steps_json},
  };
  return ReadTable(db_, "rollouts", "started_ms", kColumns, since_ms);
}

Distribution Percentiles(std::vector<int64_t> values) {
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  auto rank = [&](int pct) {
    // Nearest rank: ceil(pct/100 * n), 1-based; integer arithmetic keeps it exact.
    int64_t r = (pct * d.count + 99) / 100;
    return values[static_cast<size_t>(std::clamp<int64_t>(r, 1, d.count) - 1)];
  };
  d.p50 = rank(50);
  d.p95 = rank(95);
  d.p99 = rank(99);
  d.max = values.back();
  return d;
}

Result<Report> BuildReport(LedgerReader& reader, const ReportOptions& options) {
  Report rep;
  rep.now_ms = options.now_ms;
  rep.window_ms = options.since_ms;
  rep.from_ms = options.since_ms ? std::max<int64_t>(0, options.now_ms - *options.since_ms) : 0;

  WSUP_ASSIGN_OR_RETURN(auto cache, reader.CacheEvents(rep.from_ms));
  std::map<std::string, int64_t> reasons;
  for (const auto& e : cache) {
    ++rep.cache.lookups;
    if (e.result == "hit") {
      ++rep.cache.hits;
    } else {
      ++rep.cache.misses;
      ++reasons[e.miss_reason.empty() ? "unknown" : e.miss_reason];
      rep.cache_miss_rows.push_back(e);
    }
  }
  if (rep.cache.lookups) rep.cache.hit_rate = static_cast<double>(rep.cache.hits) / static_cast<double>(rep.cache.lookups);
  rep.cache.miss_reasons.assign(reasons.begin(), reasons.end());
  std::stable_sort(rep.cache.miss_reasons.begin(), rep.cache.miss_reasons.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });

  WSUP_ASSIGN_OR_RETURN(auto failovers, reader.Failovers(rep.from_ms));
  std::vector<int64_t> detect, swap, failover, outage, kv_back, kv_after_gone;
  for (const auto& f : failovers) {
    ++rep.failovers.count;
    if (f.drill) ++rep.failovers.drills;
    if (f.trigger == "crash") ++rep.failovers.crash;
    if (f.trigger == "probe") ++rep.failovers.probe;
    if (f.trigger == "hang") ++rep.failovers.hang;
    if (f.trigger == "rollout") ++rep.failovers.rollout;
    detect.push_back(f.detect_ms);
    swap.push_back(f.swap_ms);
    failover.push_back(f.failover_ms);
    if (f.outage_ms) outage.push_back(*f.outage_ms);
    if (f.kv_back_ms) kv_back.push_back(*f.kv_back_ms);
    if (f.kv_full_ms && f.gone_ms) kv_after_gone.push_back(*f.kv_full_ms - *f.gone_ms);
  }
  rep.failover_rows = std::move(failovers);
  rep.failovers.detect = Percentiles(std::move(detect));
  rep.failovers.swap = Percentiles(std::move(swap));
  rep.failovers.failover = Percentiles(std::move(failover));
  rep.failovers.outage = Percentiles(std::move(outage));
  rep.failovers.kv_back = Percentiles(std::move(kv_back));
  rep.failovers.kv_after_gone = Percentiles(std::move(kv_after_gone));

  WSUP_ASSIGN_OR_RETURN(auto recoveries, reader.Recoveries(rep.from_ms));
  std::vector<int64_t> all, hit, miss;
  std::vector<RecoveryRecord> misses;
  for (const auto& r : recoveries) {
    all.push_back(r.recovery_ms);
    if (r.cache_result == "hit") hit.push_back(r.recovery_ms);
    if (r.cache_result == "miss") {
      miss.push_back(r.recovery_ms);
      misses.push_back(r);
    }
  }
  rep.recovery = Percentiles(std::move(all));
  rep.recovery_hit = Percentiles(std::move(hit));
  rep.recovery_miss = Percentiles(std::move(miss));
  std::stable_sort(misses.begin(), misses.end(),
                   [](const RecoveryRecord& a, const RecoveryRecord& b) { return a.recovery_ms > b.recovery_ms; });
  if (options.miss_tail >= 0 && misses.size() > static_cast<size_t>(options.miss_tail))
    misses.resize(static_cast<size_t>(options.miss_tail));
  rep.miss_tail = std::move(misses);

  WSUP_ASSIGN_OR_RETURN(auto restarts, reader.HolderRestarts(rep.from_ms));
  for (const auto& h : restarts) {
    ++rep.holder_restarts;
    if (h.from_fds) ++rep.holder_restarts_from_fds;
  }
  WSUP_ASSIGN_OR_RETURN(rep.rollouts, reader.Rollouts(rep.from_ms));
  WSUP_ASSIGN_OR_RETURN(rep.fences, reader.Fences(rep.from_ms));
  // Not fatal: the rows that were written are worth reporting anyway.
  auto lost = reader.Losses();
  if (!lost.ok()) {
    rep.lost_error = lost.error().message();
  } else if (lost->rows > 0 && lost->last_ms >= rep.from_ms) {
    rep.lost = std::move(*lost);
  }
  return rep;
}

nlohmann::json DistJson(const Distribution& d) {
  if (d.count == 0) return {{"count", 0}};
  return {{"count", d.count}, {"p50_ms", d.p50}, {"p95_ms", d.p95}, {"p99_ms", d.p99}, {"max_ms", d.max}};
}

namespace {

std::string Dist(const Distribution& d) {
  if (d.count == 0) return "none";
  std::ostringstream os;
  os << "p50 " << d.p50 << " ms, p95 " << d.p95 << " ms, p99 " << d.p99 << " ms, max " << d.max << " ms (n="
     << d.count << ")";
  return os.str();
}

std::string WindowText(const Report& r) {
  if (!r.window_ms) return "all time";
  int64_t ms = *r.window_ms;
  struct Unit {
    int64_t ms;
    const char* name;
  };
  for (Unit u : {Unit{7 * 86'400'000LL, "w"}, Unit{86'400'000, "d"}, Unit{3'600'000, "h"}, Unit{60'000, "m"},
                 Unit{1000, "s"}})
    if (ms >= u.ms && ms % u.ms == 0) return "last " + std::to_string(ms / u.ms) + u.name;
  return "last " + std::to_string(ms) + "ms";
}

std::string UtcText(int64_t ms) {
  time_t secs = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  char buf[32];
  if (!gmtime_r(&secs, &tm) || std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm) == 0)
    return std::to_string(ms) + " ms";
  return buf;
}

// "1 failover_times, 2 failovers": by table name.
std::string LostTables(const LedgerLosses& l) {
  std::string out;
  for (const auto& [table, n] : l.by_table) out += (out.empty() ? "" : ", ") + std::to_string(n) + " " + table;
  return out;
}

}  // namespace

std::string RenderReportText(const Report& r) {
  std::ostringstream os;
  os << "wsup report (" << WindowText(r) << ")\n";
  // First, so that nobody reads the counts below as complete.
  if (r.lost) {
    const LedgerLosses& l = *r.lost;
    os << "ledger: " << l.rows << " row(s) NOT recorded (" << LostTables(l) << "), from " << UtcText(l.first_ms)
       << " to " << UtcText(l.last_ms) << "; the counts below miss them; last error: " << l.last_error << "\n";
  }
  if (!r.lost_error.empty()) os << "ledger: cannot tell whether rows were lost: " << r.lost_error << "\n";
  os << "cache: " << r.cache.lookups << " lookups, " << r.cache.hits << " hits, " << r.cache.misses << " misses";
  if (r.cache.hit_rate) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", *r.cache.hit_rate * 100.0);
    os << ", hit rate " << buf;
  } else {
    os << ", hit rate n/a";
  }
  os << "\n";
  for (const auto& [reason, n] : r.cache.miss_reasons) os << "  miss " << reason << ": " << n << "\n";
  os << "failovers: " << r.failovers.count << " (crash " << r.failovers.crash << ", probe " << r.failovers.probe
     << ", hang " << r.failovers.hang << ", rollout " << r.failovers.rollout << ", drills " << r.failovers.drills
     << ")";
  if (r.lost && r.lost->by_table.count("failovers"))
    os << ", and " << r.lost->by_table.at("failovers") << " more NOT recorded";
  os << "\n";
  if (r.failovers.count) {
    os << "  detect:   " << Dist(r.failovers.detect) << "\n";
    os << "  swap:     " << Dist(r.failovers.swap) << "\n";
    os << "  failover: " << Dist(r.failovers.failover) << "\n";
    os << "  outage:   " << Dist(r.failovers.outage) << "\n";
    if (r.failovers.kv_back.count) os << "  full KV:  " << Dist(r.failovers.kv_back) << "\n";
    if (r.failovers.kv_after_gone.count) {
      os << "  full KV after the old engine's exit: " << Dist(r.failovers.kv_after_gone) << "\n";
    }
  }
  os << "recovery: " << Dist(r.recovery) << "\n";
  os << "  after a hit:  " << Dist(r.recovery_hit) << "\n";
  os << "  after a miss: " << Dist(r.recovery_miss) << "\n";
  if (!r.miss_tail.empty()) {
    os << "slowest recoveries after a miss:\n";
    for (const auto& m : r.miss_tail) {
      os << "  #" << m.id << " " << m.recovery_ms << " ms, slot " << m.slot << ", cause " << m.cause
         << ", miss " << (m.cache_reason.empty() ? "unknown" : m.cache_reason);
      if (m.failover_id) os << ", failover #" << *m.failover_id;
      os << "\n";
    }
  }
  os << "holder restarts: " << r.holder_restarts << " (" << r.holder_restarts_from_fds << " from kept fds)\n";
  os << "rollouts: " << r.rollouts.size() << "\n";
  for (const auto& ro : r.rollouts) {
    os << "  #" << ro.id << " " << ro.outcome;
    if (ro.ended_ms) os << " in " << (*ro.ended_ms - ro.started_ms) << " ms";
    if (!ro.reason.empty()) os << ": " << ro.reason;
    os << "\n    from " << ro.command_before << "\n    to   " << ro.command_after << "\n";
  }
  if (!r.fences.empty()) {
    os << "engines fenced: " << r.fences.size() << "\n";
    for (const auto& f : r.fences) {
      os << "  #" << f.id << " engine " << f.slot << " (pid " << f.pid << ", " << f.slot_state << "), " << f.kind
         << ": " << f.reason << "\n";
    }
  }
  return os.str();
}

std::string RenderReportJson(const Report& r) {
  nlohmann::json j;
  j["now_ms"] = r.now_ms;
  j["from_ms"] = r.from_ms;
  j["window_ms"] = r.window_ms ? nlohmann::json(*r.window_ms) : nlohmann::json(nullptr);
  nlohmann::json reasons = nlohmann::json::object();
  for (const auto& [reason, n] : r.cache.miss_reasons) reasons[reason] = n;
  j["cache"] = {{"lookups", r.cache.lookups},
                {"hits", r.cache.hits},
                {"misses", r.cache.misses},
                {"hit_rate", r.cache.hit_rate ? nlohmann::json(*r.cache.hit_rate) : nlohmann::json(nullptr)},
                {"miss_reasons", reasons}};
  j["failovers"] = {{"count", r.failovers.count},        {"crash", r.failovers.crash},
                    {"probe", r.failovers.probe},        {"hang", r.failovers.hang},
                    {"rollout", r.failovers.rollout},    {"drills", r.failovers.drills},
                    {"detect", DistJson(r.failovers.detect)}, {"swap", DistJson(r.failovers.swap)},
                    {"failover", DistJson(r.failovers.failover)}, {"outage", DistJson(r.failovers.outage)},
                    {"kv_back", DistJson(r.failovers.kv_back)},
                    {"kv_after_gone", DistJson(r.failovers.kv_after_gone)}};
  j["recovery"] = {{"all", DistJson(r.recovery)}, {"hit", DistJson(r.recovery_hit)}, {"miss", DistJson(r.recovery_miss)}};
  nlohmann::json tail = nlohmann::json::array();
  for (const auto& m : r.miss_tail) {
    nlohmann::json phases = nlohmann::json::parse(m.phases_json, nullptr, /*allow_exceptions=*/false);
    tail.push_back({{"id", m.id},
                    {"failover_id", m.failover_id ? nlohmann::json(*m.failover_id) : nlohmann::json(nullptr)},
                    {"slot", m.slot},
                    {"cause", m.cause},
                    {"fault_ms", m.fault_ms},
                    {"ready_ms", m.ready_ms},
                    {"recovery_ms", m.recovery_ms},
                    {"miss_reason", m.cache_reason},
                    {"phases", phases.is_discarded() ? nlohmann::json(m.phases_json) : phases}});
  }
  j["miss_tail"] = tail;
  j["holder_restarts"] = {{"count", r.holder_restarts}, {"from_fds", r.holder_restarts_from_fds}};
  nlohmann::json rolls = nlohmann::json::array();
  for (const auto& ro : r.rollouts) {
    nlohmann::json steps = nlohmann::json::parse(ro.steps_json, nullptr, /*allow_exceptions=*/false);
    rolls.push_back({{"id", ro.id},
                     {"started_ms", ro.started_ms},
                     {"ended_ms", ro.ended_ms ? nlohmann::json(*ro.ended_ms) : nlohmann::json(nullptr)},
                     {"outcome", ro.outcome},
                     {"reason", ro.reason},
                     {"command_before", ro.command_before},
                     {"command_after", ro.command_after},
                     {"steps", steps.is_discarded() ? nlohmann::json(ro.steps_json) : steps}});
  }
  j["rollouts"] = rolls;
  nlohmann::json fences = nlohmann::json::array();
  for (const auto& f : r.fences) {
    fences.push_back({{"id", f.id},
                      {"time_ms", f.time_ms},
                      {"slot", f.slot},
                      {"pid", f.pid},
                      {"slot_state", f.slot_state},
                      {"kind", f.kind},
                      {"pool_owner", f.pool_owner.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.pool_owner)},
                      {"reason", f.reason}});
  }
  j["fences"] = fences;
  if (r.lost) {
    nlohmann::json by = nlohmann::json::object();
    for (const auto& [table, n] : r.lost->by_table) by[table] = n;
    j["lost"] = {{"rows", r.lost->rows},
                 {"by_table", by},
                 {"first_ms", r.lost->first_ms},
                 {"last_ms", r.lost->last_ms},
                 {"last_error", r.lost->last_error}};
  } else {
    j["lost"] = nullptr;
  }
  if (!r.lost_error.empty()) j["lost_error"] = r.lost_error;
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace wsup
