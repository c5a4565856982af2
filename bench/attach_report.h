// What wsup-bench-attach prints and how it reads sizes: its table rows,
// the numbers in them, and the medians over fresh attaching processes.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup::attach_report {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b);
// 1536 -> "1.50 KiB".
std::string Bytes(double b);
// "96G", "256MiB", "4096": a size in bytes; K, M, G and T are powers of 1024.
Result<uint64_t> ParseBytes(const std::string& s);
uint64_t PeakRssBytes();

// One row of the printed table: the step, its time, what it says.
void Row(const char* step, const std::string& time, const std::string& detail);
std::string Fmt(const char* fmt, double v);
double Median(std::vector<double> v);
// Median of each attach phase over the runs (each phase's own median, not
// the phases of the run with the median total), with the totals' range.
nlohmann::json MedianPhases(const std::vector<nlohmann::json>& runs);
// The phases of MedianPhases() as one line.
std::string PhasesText(const nlohmann::json& p);

}  // namespace wsup::attach_report
