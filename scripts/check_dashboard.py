#!/usr/bin/env python3
"""Checks a Grafana dashboard of wsup's metrics (contrib/grafana/wsup.json).

  scripts/check_dashboard.py [DASHBOARD] [--metrics-doc docs/metrics.md] [--promtool PATH]

What it checks, each failure one line naming the panel and the fix:
  - the JSON is a dashboard of the schema version Grafana 10 and 11 write
    (schemaVersion 36 to 41), with a title, a uid, and the `datasource`
    and `node` variables every query uses;
  - every panel has a unique id, a known type, a place on the 24-column
    grid, and at least one query; every query has a unique refId and an
    expression on the dashboard's Prometheus datasource;
  - every wsup_ series a query names is listed in docs/metrics.md (and
    filtered by the `node` variable, so that the dashboard shows one node
    or many);
  - with --promtool (Debian's prometheus package), every expression parses
    as PromQL: they are checked as recording rules by `promtool check rules`,
    with Grafana's variables put in as a scrape would see them.

Exits 0 when all hold, 1 with the list otherwise. The queries, as
Prometheus gets them, are also what `panel_queries()` gives to a test that
runs them against a real server.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "state-timeline", "status-history", "table", "heatmap",
               "barchart", "text", "row"}
SCHEMA_VERSIONS = range(36, 42)
SERIES = re.compile(r"\b(wsup_[a-z0-9_]+)")
HIST_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def panels_of(dash):
    """Every panel, those inside collapsed rows too, rows excluded."""
    out = []
    for p in dash.get("panels", []):
        if p.get("type") == "row":
            out.extend(q for q in p.get("panels", []) if q.get("type") != "row")
        else:
            out.append(p)
    return out


def substitute(expr, rate_interval="1m", node=".*"):
    """A panel's expression as Prometheus gets it from Grafana."""
    return expr.replace("$__rate_interval", rate_interval).replace("$node", node)


def panel_queries(dash, rate_interval="1m", node=".*"):
    """(panel title, refId, expression) of every query of every panel."""
    out = []
    for p in panels_of(dash):
        for t in p.get("targets", []):
            out.append((p.get("title", "?"), t.get("refId", "?"), substitute(t.get("expr", ""), rate_interval, node)))
    return out


def documented_series(metrics_md):
    """The series names docs/metrics.md lists in its table (`name` in the first column)."""
    names = set()
    with open(metrics_md, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\|\s*`(wsup_[a-z0-9_]+)`\s*\|", line)
            if m:
                names.add(m.group(1))
    return names


def check(dash, documented, promtool=None):
    errors = []
    if not isinstance(dash, dict):
        return ["the file is not a JSON object; a Grafana dashboard is one (export it with 'Export for sharing')"]
    sv = dash.get("schemaVersion")
    if not isinstance(sv, int) or sv not in SCHEMA_VERSIONS:
        errors.append("schemaVersion is %r; write one Grafana 10 or 11 reads (36 to 41)" % (sv,))
    for key in ("title", "uid"):
        if not isinstance(dash.get(key), str) or not dash.get(key):
            errors.append("the dashboard has no %s; give it one" % key)
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", []) if isinstance(v, dict)}
    if variables.get("datasource", {}).get("type") != "datasource" or variables["datasource"].get("query") != "prometheus":
        errors.append("no 'datasource' variable of type datasource for prometheus; the queries name ${datasource}")
    if "node" not in variables:
        errors.append("no 'node' variable; the queries filter by instance=~\"$node\"")
    ids = set()
    for p in panels_of(dash):
        title = p.get("title") or "(untitled)"
        where = "panel %r" % title
        if not p.get("title"):
            errors.append("a panel (id %r) has no title; give it one" % p.get("id"))
        pid = p.get("id")
        if not isinstance(pid, int) or pid in ids:
            errors.append("%s: id %r is missing or used twice; give each panel its own" % (where, pid))
        ids.add(pid)
        if p.get("type") not in PANEL_TYPES:
            errors.append("%s: type %r is not one of Grafana's panels (%s)" % (where, p.get("type"), ", ".join(sorted(PANEL_TYPES))))
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")) or g.get("x", 0) + g.get("w", 0) > 24:
            errors.append("%s: gridPos %r is not a place on the 24-column grid" % (where, g))
        targets = p.get("targets", [])
        if p.get("type") != "text" and not targets:
            errors.append("%s: no query; add a target with an expr" % where)
        if p.get("datasource", {}).get("uid") != "${datasource}":
            errors.append("%s: its datasource is not ${datasource}; use the dashboard's variable" % where)
        refs = set()
        for t in targets:
            ref, expr = t.get("refId"), t.get("expr")
            if not ref or ref in refs:
                errors.append("%s: refId %r is missing or used twice" % (where, ref))
            refs.add(ref)
            if not isinstance(expr, str) or not expr.strip():
                errors.append("%s: query %s has no expr" % (where, ref))
                continue
            for name in sorted(set(SERIES.findall(expr))):
                base = HIST_SUFFIX.sub("", name)
                if name not in documented and base not in documented:
                    errors.append("%s: query %s names %s, which docs/metrics.md does not list; use a listed series or "
                                  "list it" % (where, ref, name))
            if "$node" not in expr:
                errors.append("%s: query %s is not filtered by instance=~\"$node\"" % (where, ref))
    if promtool and not errors:
        errors.extend(check_promql(panel_queries(dash), promtool))
    return errors


def check_promql(queries, promtool):
    """Each expression as a recording rule through `promtool check rules`."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "wsup:check_%d" % i, "expr": expr} for i, (_, _, expr) in enumerate(queries)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        json.dump(rules, f)  # JSON is YAML
        path = f.name
    try:
        r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    if r.returncode == 0:
        return []
    out = (r.stdout + r.stderr).strip()
    errors = []
    for m in re.finditer(r"wsup:check_(\d+)|group \"dashboard\", rule (\d+)", out):
        i = int(m.group(1) or m.group(2)) - (0 if m.group(1) else 1)
        if 0 <= i < len(queries):
            title, ref, expr = queries[i]
            errors.append("panel %r: query %s does not parse as PromQL: %s" % (title, ref, expr))
    return errors or ["promtool check rules refused the queries: " + out[-2000:]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dashboard", nargs="?", default=os.path.join(ROOT, "contrib", "grafana", "wsup.json"))
    ap.add_argument("--metrics-doc", default=os.path.join(ROOT, "docs", "metrics.md"))
    ap.add_argument("--promtool", default=None)
    a = ap.parse_args()
    try:
        with open(a.dashboard, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        print("%s: cannot be read as JSON: %s" % (a.dashboard, e))
        return 1
    errors = check(dash, documented_series(a.metrics_doc), a.promtool)
    for e in errors:
        print("%s: %s" % (a.dashboard, e))
    if errors:
        return 1
    print("%s: %d panels, %d queries: all hold" % (a.dashboard, len(panels_of(dash)), len(panel_queries(dash))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
