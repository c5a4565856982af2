#include "state/report_html.h"

#include <string_view>
#include <utility>

namespace wsup {
namespace {

using nlohmann::json;

json Opt(const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); }

// The page around the data. Its script draws into the elements below from
// the JSON in #wsup-report-data; nothing is fetched.
constexpr std::string_view kHead = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>wsup report</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
.sub { color: #5b6475; }
svg text { font-size: 11px; fill: #5b6475; }
.failover { fill: #d63a3a; }
.rollout { fill: #3a6fd6; opacity: 0.35; }
.miss { fill: #e69419; }
.failover-bar { display: flex; align-items: center; margin: 3px 0; }
.failover-bar .label { width: 330px; flex: none; font-size: 12px; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; }
.failover-bar .track { flex: 1; display: flex; height: 16px; background: #f0f2f6; }
.seg { height: 16px; }
.seg.detect { background: #d63a3a; } .seg.swap { background: #e69419; }
.seg.answer { background: #3aa65b; } .seg.kv { background: #3a6fd6; }
.failover-bar .total { width: 90px; flex: none; text-align: right; font-size: 12px; }
.legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; vertical-align: -2px; }
table { border-collapse: collapse; }
td, th { border: 1px solid #d8dce4; padding: 3px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
</style>
</head>
<body>
<h1>wsup report</h1>
<div class="sub" id="window"></div>
<h2>Timeline</h2>
<div class="legend"><span class="failover" style="background:#d63a3a"></span>failover
<span style="background:#3a6fd6;opacity:.35"></span>rollout<span style="background:#e69419"></span>cache miss</div>
<svg id="timeline" width="1100" height="90" role="img" aria-label="timeline"></svg>
<h2>Failover phases</h2>
<div class="legend"><span style="background:#d63a3a"></span>detect<span style="background:#e69419"></span>swap
<span style="background:#3aa65b"></span>to the first correct answer<span style="background:#3a6fd6"></span>to the KV pool back</div>
<div id="phases"></div>
<h2>Percentiles (ms)</h2>
<table id="percentiles"><thead><tr><th></th><th>count</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr></thead>
<tbody></tbody></table>
<script type="application/json" id="wsup-report-data">)HTML";

constexpr std::string_view kTail = R"HTML(</script>
<script>
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("wsup-report-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const iso = (ms) => new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  const el = (tag, attrs, text) => {
    const e = tag.startsWith("svg:") ? document.createElementNS(NS, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const times = [];
  for (const f of data.failovers) times.push(f.fault_ms);
  for (const r of data.rollouts) times.push(r.started_ms, r.ended_ms || data.now_ms);
  for (const m of data.cache_misses) times.push(m.time_ms);
  const start = data.from_ms > 0 ? data.from_ms : (times.length ? Math.min(...times) : data.now_ms - 1);
  const end = Math.max(data.now_ms, ...times, start + 1);
  document.getElementById("window").textContent =
    iso(start) + " to " + iso(end) + ": " + data.failovers.length + " failovers, " + data.rollouts.length +
    " rollouts, " + data.cache_misses.length + " cache misses";

  const svg = document.getElementById("timeline");
  const W = 1100, left = 10, right = 10;
  const x = (t) => left + (W - left - right) * (t - start) / (end - start);
  svg.appendChild(el("svg:line", {x1: left, x2: W - right, y1: 60, y2: 60, stroke: "#9aa3b5"}));
  for (let i = 0; i <= 3; i++) {
    const t = start + (end - start) * i / 3;
    const anchor = i === 0 ? "start" : i === 3 ? "end" : "middle";
    svg.appendChild(el("svg:text", {x: x(t), y: 80, "text-anchor": anchor}, iso(t)));
  }
  for (const r of data.rollouts) {
    const rect = el("svg:rect", {class: "event rollout", x: x(r.started_ms), y: 8, height: 48,
                                 width: Math.max(2, x(r.ended_ms || end) - x(r.started_ms))});
    rect.appendChild(el("svg:title", {}, "rollout " + r.id + ": " + r.outcome + (r.reason ? " (" + r.reason + ")" : "")));
    svg.appendChild(rect);
  }
  for (const m of data.cache_misses) {
    const cx = x(m.time_ms);
    const d = el("svg:path", {class: "event miss", d: `M${cx},36 l6,8 l-6,8 l-6,-8 z`});
    d.appendChild(el("svg:title", {}, "cache miss, slot " + m.slot + ": " + m.reason + " at " + iso(m.time_ms)));
    svg.appendChild(d);
  }
  for (const f of data.failovers) {
    const r = el("svg:rect", {class: "event failover", x: x(f.fault_ms) - 1.5, y: 14, width: 3, height: 42});
    r.appendChild(el("svg:title", {}, "failover " + f.id + " (" + f.trigger + ") " + f.from + " -> " + f.to + ": " +
                                   f.reason + " at " + iso(f.fault_ms)));
    svg.appendChild(r);
  }

  // Each failover's phases, on one scale: the longest failover fills its track.
  const phases = (f) => {
    const out = [["detect", f.detected_ms - f.fault_ms], ["swap", f.swapped_ms - f.detected_ms]];
    let at = f.swapped_ms;
    if (f.first_ok_ms !== null && f.first_ok_ms >= at) { out.push(["answer", f.first_ok_ms - at]); at = f.first_ok_ms; }
    if (f.kv_full_ms !== null && f.kv_full_ms >= at) out.push(["kv", f.kv_full_ms - at]);
    return out.map(([k, v]) => [k, Math.max(0, v)]);
  };
  const total = (f) => phases(f).reduce((a, [, v]) => a + v, 0);
  const longest = Math.max(1, ...data.failovers.map(total));
  const box = document.getElementById("phases");
  let bars = 0;
  for (const f of data.failovers) {
    const row = el("div", {class: "failover-bar", "data-id": f.id});
    row.appendChild(el("div", {class: "label", title: f.reason},
                       "#" + f.id + " " + f.trigger + " " + f.from + " -> " + f.to + ", " + iso(f.fault_ms)));
    const track = el("div", {class: "track"});
    for (const [k, v] of phases(f)) {
      const seg = el("div", {class: "seg " + k, style: "width:" + (100 * v / longest).toFixed(3) + "%"});
      seg.title = k + ": " + v + " ms";
      track.appendChild(seg);
    }
    row.appendChild(track);
    row.appendChild(el("div", {class: "total"}, total(f) + " ms"));
    box.appendChild(row);
    bars++;
  }
  if (!data.failovers.length) box.appendChild(el("div", {class: "sub"}, "no failover in this window"));

  const tbody = document.querySelector("#percentiles tbody");
  for (const [name, d] of data.percentiles) {
    const tr = el("tr");
    tr.appendChild(el("td", {}, name));
    for (const k of ["count", "p50_ms", "p95_ms", "p99_ms", "max_ms"]) {
      tr.appendChild(el("td", {}, d.count ? String(d[k]) : "-"));
    }
    tbody.appendChild(tr);
  }
  document.body.dataset.rendered = String(bars);
})();
</script>
</body>
</html>
)HTML";

}  // namespace

json ReportPageData(const Report& r) {
  json failovers = json::array();
  for (const FailoverRecord& f : r.failover_rows) {
    // Its times as they happened (the bars are drawn from them), and what
    // a person reads beside the bar.
    json row = {{"fault_ms", f.fault_ms},          {"detected_ms", f.detected_ms}, {"swapped_ms", f.swapped_ms},
                {"first_ok_ms", Opt(f.first_ok_ms)}, {"kv_full_ms", Opt(f.kv_full_ms)}};
    row.update({{"id", f.id}, {"trigger", f.trigger}, {"reason", f.reason}, {"drill", f.drill}});
    row.update({{"from", f.from_slot}, {"to", f.to_slot}});
    failovers.push_back(std::move(row));
  }
  json rollouts = json::array();
  for (const RolloutRecord& ro : r.rollouts) {
    // Not the engine commands: they are the operator's, and a report page
    // travels further than the ledger.
    json row = {{"id", ro.id}, {"started_ms", ro.started_ms}, {"ended_ms", Opt(ro.ended_ms)}};
    row["outcome"] = ro.outcome;
    row["reason"] = ro.reason;
    rollouts.push_back(std::move(row));
  }
  json misses = json::array();
  for (const CacheEventRecord& m : r.cache_miss_rows) {
    misses.push_back({{"time_ms", m.time_ms}, {"slot", m.slot}, {"reason", m.miss_reason}});
  }
  json percentiles = json::array({json::array({"failover: detect", DistJson(r.failovers.detect)}),
                                  json::array({"failover: detect and swap", DistJson(r.failovers.failover)}),
                                  json::array({"failover: to the first correct answer", DistJson(r.failovers.outage)}),
                                  json::array({"failover: to the KV pool back", DistJson(r.failovers.kv_back)}),
                                  json::array({"recovery: all", DistJson(r.recovery)}),
                                  json::array({"recovery: after a cache hit", DistJson(r.recovery_hit)}),
                                  json::array({"recovery: after a cache miss", DistJson(r.recovery_miss)})});
  return {{"from_ms", r.from_ms},    {"now_ms", r.now_ms},          {"failovers", failovers},
          {"rollouts", rollouts},    {"cache_misses", misses},      {"percentiles", percentiles}};
}

std::string RenderReportHtml(const Report& report) {
  // In a <script> element only "</" could end it early: every '<' (which
  // JSON has only inside strings) is written as its escape.
  // A reason that is not UTF-8 (it came from a process's words) is shown
  // with replacement characters rather than refused.
  const std::string data = ReportPageData(report).dump(-1, ' ', false, json::error_handler_t::replace);
  std::string page(kHead);
  page.reserve(kHead.size() + data.size() + kTail.size() + 64);
  for (char c : data) {
    if (c == '<') {
      page += "\\u003c";
    } else {
      page += c;
    }
  }
  page += kTail;
  return page;
}

}  // namespace wsup
