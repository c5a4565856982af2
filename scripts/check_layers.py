#!/usr/bin/env python3
"""The layers of wsup's libraries, checked from their #include lines.

Each folder of library code may include only the folders below it, as the
table says; a folder not in the table is refused until it is placed, so a new
library cannot grow a cycle unnoticed. Tests, fuzz targets and benchmarks
may include anything. Some folders may use only part of a folder below them
(the front speaks JSON on Unix sockets but must not link the holder protocol,
the manifests or the CUDA loader); those parts are listed file by file.

Usage: scripts/check_layers.py [REPO_ROOT]
Prints one line per include that breaks the table, naming the file, the line
and the fix, and exits 1; prints the layers and exits 0 when all hold.
"""
import os
import re
import sys

# folder -> the folders it may include (besides itself), bottom first.
LAYERS = {
    "common": [],
    # A checkpoint's tokenizer: text in, ids out, and back.
    "text": ["common"],
    "checkpoint": ["common"],
    "gpu": ["common", "checkpoint"],
    "wire": ["common", "checkpoint"],
    "http": ["common"],
    # A group's coordination: the etcd client.
    "group": ["common", "http"],
    "state": ["common"],
    "probes": ["common", "http"],
    "holder": ["common", "checkpoint", "gpu", "wire"],
    "client": ["common", "checkpoint", "gpu", "wire"],
    "engine": ["common", "text", "checkpoint", "gpu", "wire", "client", "http"],
    "front": ["common", "http", "wire"],
    "supervisor": ["common", "checkpoint", "gpu", "wire", "client", "http", "group", "probes", "state"],
    # What tests and benchmarks share (control and HTTP clients, fd passing,
    # load and drills): it speaks to the processes, never links their insides.
    "testkit": ["common", "checkpoint", "wire", "http"],
}

# (folder, included folder) -> the only headers of it that folder may include.
ONLY = {
    ("front", "wire"): {"wire/json_frame.h", "wire/json_socket.h"},
}

# Folders that are not library code: anything goes, except what APART says.
FREE = {"tests", "fuzz", "bench", "build", "docs", "scripts", "systemd", "config", "node_modules"}
# Free folders that must not include each other's files: what both need
# belongs in testkit/.
APART = {"tests": {"bench"}, "bench": {"tests"}}

SOURCE = re.compile(r"\.(cc|h|cu|cuh|cpp|hpp)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def includes(path):
    """(line number, included path) of every quoted #include with a folder."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m and "/" in m.group(1):
                yield n, m.group(1)


def apart_problems(root, top, path):
    out = []
    for d, _, fs in os.walk(path):
        if "node_modules" in d:
            continue
        for f in sorted(fs):
            if not SOURCE.search(f):
                continue
            src = os.path.join(d, f)
            for n, inc in includes(src):
                dep = inc.split("/", 1)[0]
                if dep in APART.get(top, ()):
                    out.append(f"{os.path.relpath(src, root)}:{n}: {top}/ includes {inc}, but {top}/ and {dep}/ "
                               f"must not include each other's files (scripts/check_layers.py); move what both "
                               f"need to testkit/")
    return out


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems = []
    for top in sorted(os.listdir(root)):
        path = os.path.join(root, top)
        if not os.path.isdir(path) or top.startswith(".") or top.startswith("build"):
            continue
        if top in FREE:
            problems.extend(apart_problems(root, top, path))
            continue
        sources = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if SOURCE.search(f)]
        if not sources:
            continue
        if top not in LAYERS:
            problems.append(f"{top}/: a folder of library code that is not in the layer table; add it to LAYERS in "
                            f"scripts/check_layers.py with the folders it may include")
            continue
        allowed = set(LAYERS[top]) | {top}
        for src in sorted(sources):
            rel = os.path.relpath(src, root)
            with open(src, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m or "/" not in m.group(1):
                        continue
                    inc = m.group(1)
                    dep = inc.split("/", 1)[0]
                    if dep not in LAYERS and not os.path.isdir(os.path.join(root, dep)):
                        continue  # a generated or system header with a slash
                    if dep not in allowed:
                        problems.append(f"{rel}:{n}: {top}/ includes {inc}, but {top}/ may include only "
                                        f"{', '.join(sorted(allowed - {top})) or 'nothing'} (scripts/check_layers.py); "
                                        f"move the code to a lower layer or depend on an interface")
                    elif (top, dep) in ONLY and inc not in ONLY[(top, dep)]:
                        problems.append(f"{rel}:{n}: {top}/ includes {inc}, but of {dep}/ it may use only "
                                        f"{', '.join(sorted(ONLY[(top, dep)]))} (scripts/check_layers.py)")
    for p in problems:
        print(p)
    if problems:
        print(f"layers: {len(problems)} include(s) break the table")
        return 1
    for top, deps in LAYERS.items():
        print(f"  {top:<11} -> {' '.join(deps) or '-'}")
    print("layers: every include follows the table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
