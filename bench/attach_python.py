#!/usr/bin/env python3
"""Attach time from Python beside the C++ client's, on a holder's socket.

Each run is a fresh process (as an engine starting up), which first imports
what an engine has anyway (numpy, or torch with CUDA initialised), then
times, over the holder's real socket:
  C++ Attach()     connect + handshake + manifest + mapping + name table,
                   as the C++ client measures itself (wsup_attach_ms);
  Python attach    wsup_client.attach(): the same, plus the ctypes call;
  manifest         reading every tensor's name, dtype, shape and address
                   through the C ABI;
  addressable      attach() called to every tensor's address known in
                   Python (Python attach + manifest): what C++ Attach()
                   covers;
  tensors          making every numpy array / torch tensor (no copy);
  total            attach() called to every tensor usable from Python.
Each way of reading the manifest in --readers gets --runs processes:
  table       wsup_manifest_table, one call (what the package uses);
  per-tensor  six C calls per tensor (the package before the table).
With --cpp-bench (build/bin/wsup-bench-attach), --runs fresh C++ processes
also attach the same socket (`wsup-bench-attach --socket`), the C++ figure
the ratios are taken against. The runs go round by round, one process of
each kind per round, so a drifting load weighs on every column alike.
Medians and p90s (nearest rank) are shown.
The fingerprint is computed once beforehand (from --checkpoint) and passed
as JSON, so no run reads checkpoint headers.

  bench/attach_python.py --socket SOCK --checkpoint DIR [--backend cuda]
  bench/attach_python.py --holder build/bin/wsup-holder --checkpoint DIR --backend cuda
      (starts a holder on DIR itself and stops it afterwards)
Options: --device N, --runs N (default 5), --kind numpy|torch, --lib PATH
(libwsup_client.so, else $WSUP_CLIENT_LIB), --readers table,per-tensor,
--cpp-bench PATH, --out FILE.md (also FILE.json). bench/python_attach.sh
runs it on a generated checkpoint and writes docs/benchmarks.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import wsup_client as wc  # noqa: E402
from wsup_client import _attach  # noqa: E402
from wsup_client.holder import start_holder  # noqa: E402

READERS = ("table", "per-tensor")


def child(args):
    t_import = time.perf_counter()
    if args.kind == "torch":
        import torch
        if args.backend == "cuda":
            torch.zeros(1, device="cuda:%d" % args.device)  # an engine's CUDA is up before it attaches
    else:
        __import__("numpy")  # what a host engine has loaded anyway
    wc.load_library(args.lib)
    _attach._MANIFEST_READER = args.reader
    t_ready = time.perf_counter()
    with open(args.fingerprint_file) as f:
        fp = f.read()
    t0 = time.perf_counter()
    att = wc.attach(args.socket, "daemon", fingerprint=fp, backend=args.backend, device=args.device,
                    client_name="bench-python", library=args.lib)
    t1 = time.perf_counter()
    names = att.names()
    t2 = time.perf_counter()
    tensors = att.tensors(args.kind)
    t3 = time.perf_counter()
    assert len(tensors) == len(names)
    ms = lambda a, b: (b - a) * 1000.0  # noqa: E731
    print(json.dumps({
        "tensors": len(names), "cuda": att.is_cuda, "kind": args.kind, "reader": args.reader,
        "cpp_attach_ms": att.attach_ms, "py_attach_ms": ms(t0, t1), "manifest_ms": ms(t1, t2),
        "addressable_ms": ms(t0, t2), "tensors_ms": ms(t2, t3), "total_ms": ms(t0, t3),
        "imports_ms": ms(t_import, t_ready),
    }))


def run_child(args, fp_file, reader):
    argv = [sys.executable, os.path.abspath(__file__), "--child", "--socket", args.socket, "--fingerprint-file",
            fp_file, "--backend", args.backend, "--device", str(args.device), "--kind", args.kind,
            "--reader", reader]
    if args.lib:
        argv += ["--lib", args.lib]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit("a measuring process failed (exit %d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_cpp(args, fp_file):
    """One fresh C++ process of the C++ client on the same socket."""
    argv = [args.cpp_bench, "--socket", args.socket, "--fingerprint", fp_file, "--backend", args.backend,
            "--device", str(args.device), "--runs", "1", "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit("%s failed (exit %d):\n%s%s" % (" ".join(argv), r.returncode, r.stdout, r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_all(args, fp_file, readers):
    """--runs rounds; each round runs one process of every kind in turn, so
    that a machine whose load drifts weighs on every column alike."""
    by_reader = {r: [] for r in readers}
    cpp = {"attach_ms_runs": [], "runs": []} if args.cpp_bench else None
    for _ in range(args.runs):
        for reader in readers:
            by_reader[reader].append(run_child(args, fp_file, reader))
        if cpp is not None:
            one = run_cpp(args, fp_file)
            cpp["attach_ms_runs"].append(one["attach_ms_runs"][0])
            cpp["runs"].append(one["fd_attach"])
    return by_reader, cpp


def p90(values):
    """The 90th percentile, nearest rank: the smallest value at least 90% of the runs do not exceed."""
    v = sorted(values)
    return v[max(0, -(-9 * len(v) // 10) - 1)]


def table(by_reader, cpp, args):
    first = next(iter(by_reader.values()))
    n = first[0]["tensors"]
    what = "torch tensors" if args.kind == "torch" else "numpy arrays"
    where = "cuda:%d" % args.device if first[0]["cuda"] else "host"
    readers = list(by_reader)
    names = {"table": "manifest table (now)", "per-tensor": "per-tensor calls (before)"}

    def cell(values):
        return "%.1f ms (p90 %.1f)" % (statistics.median(values), p90(values))

    def row(label, key):
        return "| %s | %s |" % (label, " | ".join(cell([r[key] for r in by_reader[k]]) for k in readers))

    lines = [
        "Python attach vs C++ attach, %d tensors (%s arena), %d fresh processes per column; median (p90)" % (
            n, where, args.runs),
        "",
        "| what | %s |" % " | ".join(names.get(k, k) for k in readers),
        "|---|%s" % ("---|" * len(readers)),
    ]
    if cpp is not None:
        c = cpp["attach_ms_runs"]
        lines.append("| C++ client `Attach()`, fresh C++ processes (`wsup-bench-attach --socket`) | %s |" % " | ".join(
            [cell(c)] * len(readers)))
    lines += [
        row("C++ `Attach()` inside the Python process (`wsup_attach_ms`)", "cpp_attach_ms"),
        row("Python `wsup_client.attach()`", "py_attach_ms"),
        row("Python manifest read (name, dtype, shape, address of each tensor)", "manifest_ms"),
        row("Python: `attach()` to every tensor addressable (the two above)", "addressable_ms"),
        row("Python: make %d %s (no copy)" % (n, what), "tensors_ms"),
        row("Python total: `attach()` to every tensor usable", "total_ms"),
    ]
    if cpp is not None:
        base = statistics.median(cpp["attach_ms_runs"])
        ratio = {}
        for label, key in (("addressable", "addressable_ms"), ("total", "total_ms")):
            ratio[key] = {k: statistics.median(r[key] for r in by_reader[k]) / base for k in readers}
            lines.append("| ratio Python %s / C++ fresh process (medians) | %s |" % (label, " | ".join(
                "%.1fx" % ratio[key][k] for k in readers)))
        lines.append("| goal: Python attach to every tensor addressable at most 2x the C++ client | %s |" % " | ".join(
            ("met" if ratio["addressable_ms"][k] <= 2 else "NOT met") for k in readers))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", help="an existing holder's socket")
    ap.add_argument("--holder", help="instead: start this wsup-holder on --checkpoint for the measurement")
    ap.add_argument("--checkpoint", help="the holder's checkpoint folder (for the fingerprint)")
    ap.add_argument("--fingerprint-file", help="instead of --checkpoint: the fingerprint as a JSON file")
    ap.add_argument("--backend", default="host", choices=("host", "cuda"))
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--kind", choices=("numpy", "torch"), help="default: torch for cuda, numpy for host")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--lib", help="libwsup_client.so (default: $WSUP_CLIENT_LIB, then the usual places)")
    ap.add_argument("--readers", default="table",
                    help="comma-separated ways to read the manifest, columns in this order: table, per-tensor")
    ap.add_argument("--cpp-bench", help="wsup-bench-attach, to time the C++ client in fresh C++ processes too")
    ap.add_argument("--reader", default="table", choices=READERS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help="also write the table to this .md file (and the raw runs beside it as .json)")
    ap.add_argument("--holder-timeout", type=float, default=1800, help="seconds a started holder may take to load")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.kind is None:
        args.kind = "torch" if args.backend == "cuda" else "numpy"
    if args.child:
        return child(args)
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    if not readers or any(r not in READERS for r in readers):
        ap.error("--readers takes a comma-separated list of: %s" % ", ".join(READERS))
    if not args.socket and not args.holder:
        ap.error("give --socket of a running holder, or --holder to start one")
    if not args.fingerprint_file and not args.checkpoint:
        ap.error("give --checkpoint (or --fingerprint-file) so the fingerprint can be presented")

    with tempfile.TemporaryDirectory(prefix="wsup-bench-py-") as tmp:
        h = None
        try:
            if args.holder:
                print("starting %s on %s (%s) ..." % (args.holder, args.checkpoint, args.backend), flush=True)
                h = start_holder(args.holder, args.checkpoint, tmp, args=["--backend", args.backend, "--device",
                                                                          str(args.device)],
                                 timeout_s=args.holder_timeout)
                args.socket = h.socket
            fp_file = args.fingerprint_file
            if not fp_file:
                # The holder's fingerprint after a match is this engine's own.
                att = wc.attach(args.socket, "client", checkpoint_dir=args.checkpoint, backend=args.backend,
                                device=args.device, library=args.lib)
                if not att.from_holder:
                    sys.exit("the holder does not serve %s as this process would: %s" % (args.checkpoint,
                                                                                       att.reason))
                fp_file = os.path.join(tmp, "fingerprint.json")
                with open(fp_file, "w") as f:
                    json.dump(att.holder_fingerprint, f)
                att.close()
                del att
            by_reader, cpp = run_all(args, fp_file, readers)
        finally:
            if h is not None:
                h.stop()
    md = table(by_reader, cpp, args)
    print(md)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(md)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump({"python": by_reader, "cpp": cpp}, f, indent=1)


if __name__ == "__main__":
    main()
