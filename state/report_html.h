// The ledger's report as one self-contained HTML page (`wsup report --html
// FILE`), for a person without a dashboard: a timeline of the window's
// failovers, rollouts and cache misses; each failover's phases as a bar
// (detect, swap, to the first correct answer, to the KV pool back); and the
// failover and recovery percentiles.
//
// The page needs nothing but a browser: its style and its script are inline,
// and the report's numbers are embedded as JSON that the script draws. When
// the script has drawn everything it sets `data-rendered` on <body> to the
// number of failover bars, which is what a test (or a person in the
// console) can check.
//
// Pure; any thread.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "state/report.h"

namespace wsup {

// The numbers the page draws (also embedded in it as JSON).
nlohmann::json ReportPageData(const Report& report);

std::string RenderReportHtml(const Report& report);

}  // namespace wsup
