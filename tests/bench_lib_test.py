#!/usr/bin/env python3
"""Tests of bench/lib.sh, what the benchmark scripts share: their arguments
refused with the usage, a missing program named with how to build it, the
device as a node config says it, and a node config that `wsup check`
accepts. Usage: bench_lib_test.py BIN_DIR"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LIB = os.path.join(ROOT, "bench", "lib.sh")
BIN = os.path.abspath(sys.argv[1])
TMP = tempfile.mkdtemp(prefix="wsup-bench-lib-")


def bash(script, *args):
    # A script in bench/ sources lib.sh beside it; this one names it.
    p = subprocess.run(["bash", "-c", f'set -euo pipefail\n. "{LIB}"\n{script}', "bench/x.sh", *args],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def expect(cond, what, *out):
    if not cond:
        print(f"FAILED: {what}\n" + "\n".join(str(o) for o in out))
        shutil.rmtree(TMP, True)
        sys.exit(1)


rc, out, err = bash('bench_args "usage: bench/x.sh OUTDIR [BIN_DIR]" "$@"')
expect(rc == 2 and "usage: bench/x.sh OUTDIR [BIN_DIR]" in err, "no OUTDIR: the usage, exit 2", rc, err)

rc, out, err = bash('bench_args "usage: bench/x.sh OUTDIR [BIN_DIR]" "$@"', os.path.join(TMP, "o1"),
                    os.path.join(TMP, "nothing-here"))
expect(rc == 2 and "nothing-here" in err and "BIN_DIR" in err, "a BIN_DIR that is not there is named", rc, err)

rc, out, err = bash('bench_args "usage: bench/x.sh OUTDIR [BIN_DIR]" "$@"; echo "$out|$bin|$repo"',
                    "rel-out", BIN)
expect(rc == 0 and out.strip() == f"{ROOT}/rel-out|{BIN}|{ROOT}", "OUTDIR made and absolute, BIN_DIR absolute", rc,
       out, err)
shutil.rmtree(os.path.join(ROOT, "rel-out"), True)

rc, out, err = bash('bench_args "usage: bench/x.sh OUTDIR [BIN_DIR]" "$@"; bench_need wsup no-such-program',
                    os.path.join(TMP, "o2"), BIN)
expect(rc == 1 and "no-such-program is missing; build it" in err and "wsup is missing" not in err,
       "a missing program is named with how to build it", rc, err)

rc, out, err = bash('bench_device cpu; echo "$backend|$devices_line"; bench_device cuda:0,1; echo "$backend|$devices_line"')
expect(rc == 0 and out == "host|tp = 1\ncuda|tp = 2\ndevices = [0,1]\n", "the device as a node config says it", rc, out)

cfg = os.path.join(TMP, "node", "node.toml")
model = os.environ.get("WSUP_TESTDATA_DIR", os.path.join(ROOT, "testdata")) + "/llama-tiny-f32"
rc, out, err = bash(f'''bench_args "usage: bench/x.sh OUTDIR [BIN_DIR]" "$@"
bench_device cpu
bench_node_config "{cfg}" "{TMP}/node" bench-test "{model}" '"--kv-cache-mib", "8"' 60000
cat >> "{cfg}" <<TOML
[probe]
kind = "semantic"
prompt = "Hello, world"
expect_token_ids = [1, 2]
max_tokens = 2

[front]
listen = "127.0.0.1:0"

[admin]
listen = "127.0.0.1:0"
TOML
"$bin/wsup" check "{cfg}"''', os.path.join(TMP, "o3"), BIN)
expect(rc == 0, "a node config from bench_node_config passes `wsup check`", rc, out, err)
expect(oct(os.stat(os.path.join(TMP, "node", "run")).st_mode & 0o777) == "0o700", "the runtime folder is 0700")

shutil.rmtree(TMP, True)
print("bench_lib: all cases passed")
