#!/usr/bin/env python3
"""Each crash drill of a bench/node.sh run, on one line: what the ledger
timed, and what the promoted engine's own log says about the same moments.

    bench/drill_timeline.py NODE_SH_OUTDIR

Reads OUTDIR/node/state/wsup.db (the ledger's failover rows of the drills)
and the engines' logs under OUTDIR/node/state/logs. The engine lines need
`--log-level debug` (bench/node.sh: ENGINE_LOG_LEVEL=debug): each finished
request's timing, and the KV pool's work between steps. For each drill,
the request the promoted engine finished closest before the ledger's first
correct answer (the supervisor's proof through the front) is taken as the
proof's. All times are ms after the kill. Prints a Markdown table, slowest
first answer first.
"""
import datetime
import glob
import os
import re
import sqlite3
import sys

STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)")
REQUEST = re.compile(r"request \d+ \(\w+\): (\d+) prompt and (\d+) generated tokens; first token ([\d.]+) ms after it "
                     r"came, done at ([\d.]+) ms; longest wait between two tokens ([\d.]+) ms")
POOL_WORK = re.compile(r"KV pool work between steps took ([\d.]+) ms")
AHEAD = re.compile(r"ahead of its grant in ([\d.]+) ms")
MAPPED = re.compile(r"mapped in ([\d.]+) ms")


def wall_ms(stamp):
    t = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
    return t.timestamp() * 1000


def events(path):
    """(wall ms, kind, values) of the lines this script reads."""
    out = []
    for line in open(path, errors="replace"):
        m = STAMP.match(line)
        if not m:
            continue
        t = wall_ms(m[1])
        for kind, pat in (("request", REQUEST), ("pool_work", POOL_WORK), ("ahead", AHEAD), ("mapped", MAPPED)):
            r = pat.search(line)
            if r:
                out.append((t, kind, [float(x) for x in r.groups()]))
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: bench/drill_timeline.py NODE_SH_OUTDIR")
    out = sys.argv[1]
    db = os.path.join(out, "node/state/wsup.db")
    if not os.path.exists(db):
        sys.exit(f"drill_timeline: {db} is missing; pass the folder bench/node.sh wrote")
    rows = sqlite3.connect(db).execute(
        "SELECT fault_ms, swapped_ms, first_ok_ms, gone_ms, kv_full_ms, to_slot FROM failovers WHERE drill = 1 "
        "ORDER BY id").fetchall()
    logs = {os.path.basename(p)[len("engine-"):-len(".log")]: events(p)
            for p in glob.glob(os.path.join(out, "node/state/logs/engine-*.log"))}
    table = []
    for fault, swapped, first_ok, gone, kv_full, to in rows:
        if first_ok is None:
            continue
        ev = logs.get(to, [])
        # The log's stamps are whole ms: the proof's request ends within a
        # ms of the ledger's first answer.
        reqs = [e for e in ev if e[1] == "request" and fault <= e[0] <= first_ok + 1]
        proof = reqs[-1] if reqs else None
        work = [e for e in ev if e[1] == "pool_work" and fault <= e[0] <= first_ok + 1]
        ahead = [e for e in ev if e[1] == "ahead" and fault <= e[0] <= first_ok + 200]
        came = None
        if proof:
            # The request came done_ms before its end (the stamp).
            came = proof[0] - proof[2][3] - fault
        table.append({
            "first_ok": first_ok - fault,
            "swap": swapped - fault if swapped else None,
            "gone": gone - fault if gone else None,
            "kv_full": kv_full - fault if kv_full else None,
            "came": came,
            "first_token": proof[2][2] if proof else None,
            "done": proof[2][3] if proof else None,
            "gap": proof[2][4] if proof else None,
            "pool_work": sum(e[2][0] for e in work),
            "ahead_at": ahead[0][0] - fault if ahead else None,
        })
    table.sort(key=lambda r: -r["first_ok"])

    def f(v):
        return "-" if v is None else f"{v:.1f}"

    print("| first correct answer | swap | the proof came | its first token | its end | its longest gap between "
          "tokens | pool work in the window | prefetched at | old engine's exit | full KV |")
    print("|" + "---:|" * 10)
    for r in table:
        print(f"| {f(r['first_ok'])} | {f(r['swap'])} | {f(r['came'])} | +{f(r['first_token'])} | +{f(r['done'])} | "
              f"{f(r['gap'])} | {f(r['pool_work'])} | {f(r['ahead_at'])} | {f(r['gone'])} | {f(r['kv_full'])} |")
    print()
    print("ms after the kill; the proof's first token and end are ms after it came; n =", len(table))


if __name__ == "__main__":
    main()
