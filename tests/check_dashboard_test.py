#!/usr/bin/env python3
"""Tests of scripts/check_dashboard.py: the repository's Grafana dashboard
(contrib/grafana/wsup.json) holds, its queries parse as PromQL when promtool
is installed, and each kind of broken dashboard is refused with the panel
and the fix named."""
import copy
import json
import os
import shutil
import subprocess
import sys

import script_check
from script_check import ROOT, expect

CHECK = os.path.join(ROOT, "scripts", "check_dashboard.py")
DASH = os.path.join(ROOT, "contrib", "grafana", "wsup.json")
PROMTOOL = shutil.which("promtool")


def run(dash_path, promtool=True):
    argv = [sys.executable, CHECK, dash_path]
    if promtool and PROMTOOL:
        argv += ["--promtool", PROMTOOL]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def variant(change):
    with open(DASH, encoding="utf-8") as f:
        d = json.load(f)
    change(d)
    path = os.path.join(script_check.tree("wsup-dash-", {}), "d.json")
    with open(path, "w") as f:
        json.dump(d, f)
    return path


def first_query_panel(d):
    for p in d["panels"]:
        if p.get("type") != "row" and p.get("targets"):
            return p
    raise AssertionError("the dashboard has no panel with a query")


rc, out = run(DASH)
expect(rc == 0 and "all hold" in out, "the repository's dashboard holds", out)
if not PROMTOOL:
    print("promtool not found (Debian's prometheus package; scripts/setup.sh installs it): PromQL not parsed")
with open(DASH, encoding="utf-8") as f:
    dash = json.load(f)
expect(len([p for p in dash["panels"] if p.get("type") != "row"]) >= 12, "the dashboard has its panels", "")

rc, out = run(variant(lambda d: first_query_panel(d)["targets"][0].update(expr='rate(wsup_no_such_total{instance=~"$node"}[1m])')))
expect(rc == 1 and "wsup_no_such_total" in out and "docs/metrics.md does not list" in out,
       "a query on a series the doc does not list is refused", out)

rc, out = run(variant(lambda d: first_query_panel(d)["targets"][0].update(expr="sum(rate(wsup_failovers_total[1m]))")))
expect(rc == 1 and "not filtered by instance" in out, "a query that ignores the node variable is refused", out)

if PROMTOOL:
    rc, out = run(variant(lambda d: first_query_panel(d)["targets"][0].update(
        expr='sum by (trigger (rate(wsup_failovers_total{instance=~"$node"}[1m]))')))
    title = first_query_panel(dash)["title"]
    expect(rc == 1 and "does not parse as PromQL" in out and title in out,
           "a query that is not PromQL is refused with its panel", out)


def dup_ids(d):
    ps = [p for p in d["panels"] if p.get("type") != "row"]
    ps[1]["id"] = ps[0]["id"]


rc, out = run(variant(dup_ids), promtool=False)
expect(rc == 1 and "used twice" in out, "two panels with one id are refused", out)

rc, out = run(variant(lambda d: d.update(schemaVersion=16)), promtool=False)
expect(rc == 1 and "schemaVersion is 16" in out, "an old schema version is refused", out)

rc, out = run(variant(lambda d: first_query_panel(d).update(gridPos={"h": 8, "w": 20, "x": 12, "y": 0})), promtool=False)
expect(rc == 1 and "24-column grid" in out, "a panel off the grid is refused", out)

rc, out = run(variant(lambda d: d["templating"].update(list=[])), promtool=False)
expect(rc == 1 and "'datasource' variable" in out and "'node' variable" in out, "a dashboard without its variables is refused", out)

bad = os.path.join(script_check.tree("wsup-dash-", {"d.json": "{not json"}), "d.json")
rc, out = run(bad, promtool=False)
expect(rc == 1 and "cannot be read as JSON" in out, "a file that is not JSON is refused", out)
print("check_dashboard: all expectations hold")
