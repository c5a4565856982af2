#!/usr/bin/env python3
"""Attach time from Python beside the C++ client's, on a holder's socket.

Each run is a fresh process (as an engine starting up), which first imports
what an engine has anyway (numpy, or torch with CUDA initialised), then
times, over the holder's real socket:
  C++ Attach()     connect + handshake + manifest + mapping + name table,
                   as the C++ client measures itself (wsup_attach_ms);
  Python attach    wsup_client.attach(): the same, plus the ctypes call;
  manifest walk    reading every tensor's name, dtype, shape and address
                   through the C ABI;
  tensors          making every numpy array / torch tensor (no copy);
  total            attach() called to every tensor usable from Python.
The fingerprint is computed once beforehand (from --checkpoint) and passed
as JSON, so no run reads checkpoint headers.

  bench/attach_python.py --socket SOCK --checkpoint DIR [--backend cuda]
  bench/attach_python.py --holder build/bin/wsup-holder --checkpoint DIR --backend cuda
      (starts a holder on DIR itself and stops it afterwards)
Options: --device N, --runs N (default 5), --kind numpy|torch, --lib PATH
(libwsup_client.so, else $WSUP_CLIENT_LIB), --out FILE.md (also FILE.json).
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
from wsup_client.holder import start_holder  # noqa: E402


def child(args):
    t_import = time.perf_counter()
    if args.kind == "torch":
        import torch
        if args.backend == "cuda":
            torch.zeros(1, device="cuda:%d" % args.device)  # an engine's CUDA is up before it attaches
    else:
        __import__("numpy")  # what a host engine has loaded anyway
    wc.load_library(args.lib)
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
        "tensors": len(names), "cuda": att.is_cuda, "kind": args.kind,
        "cpp_attach_ms": att.attach_ms, "py_attach_ms": ms(t0, t1), "manifest_ms": ms(t1, t2),
        "tensors_ms": ms(t2, t3), "total_ms": ms(t0, t3), "imports_ms": ms(t_import, t_ready),
    }))


def run_children(args, fp_file):
    rows = []
    for _ in range(args.runs):
        argv = [sys.executable, os.path.abspath(__file__), "--child", "--socket", args.socket, "--fingerprint-file",
                fp_file, "--backend", args.backend, "--device", str(args.device), "--kind", args.kind]
        if args.lib:
            argv += ["--lib", args.lib]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            sys.exit("a measuring process failed (exit %d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return rows


def table(rows, args):
    def cell(key):
        v = [r[key] for r in rows]
        return "%.1f ms (min %.1f, max %.1f)" % (statistics.median(v), min(v), max(v))

    n = rows[0]["tensors"]
    what = "torch tensors" if args.kind == "torch" else "numpy arrays"
    where = "cuda:%d" % args.device if rows[0]["cuda"] else "host"
    lines = [
        "Python attach vs C++ attach, %d tensors (%s arena), median of %d fresh processes; %s" % (
            n, where, len(rows), time.strftime("%Y-%m-%d")),
        "",
        "| what | measured |",
        "|---|---|",
        "| C++ client `Attach()` (connect, handshake, manifest, map, name table) | %s |" % cell("cpp_attach_ms"),
        "| Python `wsup_client.attach()` (the same through ctypes) | %s |" % cell("py_attach_ms"),
        "| Python manifest walk (name, dtype, shape, address of each tensor) | %s |" % cell("manifest_ms"),
        "| Python: make %d %s (no copy) | %s |" % (n, what, cell("tensors_ms")),
        "| Python total: attach() to every tensor usable | %s |" % cell("total_ms"),
        "| ratio Python total / C++ `Attach()` | %.1fx |" % (
            statistics.median(r["total_ms"] for r in rows) / statistics.median(r["cpp_attach_ms"] for r in rows)),
    ]
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
    ap.add_argument("--out", help="also write the table to this .md file (and the raw runs beside it as .json)")
    ap.add_argument("--holder-timeout", type=float, default=1800, help="seconds a started holder may take to load")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.kind is None:
        args.kind = "torch" if args.backend == "cuda" else "numpy"
    if args.child:
        return child(args)
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
            rows = run_children(args, fp_file)
        finally:
            if h is not None:
                h.stop()
    md = table(rows, args)
    print(md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
