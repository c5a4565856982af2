#include "bench/attach_report.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace wsup::attach_report {

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

Result<uint64_t> ParseBytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suffix = end ? end : "";
  uint64_t mult = 1;
  if (suffix == "K" || suffix == "KiB")
    mult = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB")
    mult = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB")
    mult = 1ull << 30;
  else if (suffix == "T" || suffix == "TiB")
    mult = 1ull << 40;
  else if (!suffix.empty())
    return InvalidArgument("size '" + s + "': use a number with K, M, G or T");
  if (!(v > 0)) return InvalidArgument("size '" + s + "' must be positive");
  return static_cast<uint64_t>(v * static_cast<double>(mult));
}

uint64_t PeakRssBytes() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

void Row(const char* step, const std::string& time, const std::string& detail) {
  std::printf("%-36s %-12s %s\n", step, time.c_str(), detail.c_str());
}

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

nlohmann::json MedianPhases(const std::vector<nlohmann::json>& runs) {
  nlohmann::json out = nlohmann::json::object();
  for (const char* k : {"connect_ms", "handshake_ms", "decode_ms", "checks_ms", "index_ms", "map_ms"}) {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(r["phases"][k].get<double>());
    out[k] = Median(v);
  }
  std::vector<double> total, init;
  for (const auto& r : runs) {
    total.push_back(r["attach_ms"].get<double>());
    init.push_back(r["init_ms"].get<double>());
  }
  out["attach_ms"] = Median(total);
  out["attach_min_ms"] = *std::min_element(total.begin(), total.end());
  out["attach_max_ms"] = *std::max_element(total.begin(), total.end());
  out["init_ms"] = Median(init);
  out["overlapped"] = runs.front()["phases"]["overlapped"];
  return out;
}

std::string PhasesText(const nlohmann::json& p) {
  return "connect " + Fmt("%.3f", p["connect_ms"].get<double>()) + ", handshake " +
         Fmt("%.3f", p["handshake_ms"].get<double>()) + ", decode " +
         Fmt("%.3f", p["decode_ms"].get<double>()) + ", checks " + Fmt("%.3f", p["checks_ms"].get<double>()) +
         ", index " + Fmt("%.3f", p["index_ms"].get<double>()) + ", map " +
         Fmt("%.3f", p["map_ms"].get<double>()) + " ms" +
         (p["overlapped"].get<bool>() ? " (map on a second thread, beside decode, checks and index)" : "");
}

}  // namespace wsup::attach_report
