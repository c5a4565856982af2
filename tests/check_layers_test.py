#!/usr/bin/env python3
"""Tests of scripts/check_layers.py: the repository follows its layers, and
the checker refuses each kind of break in a small tree of its own."""
import script_check
from script_check import ROOT, expect


def run(root):
    return script_check.run("check_layers.py", root)


def tree(files):
    return script_check.tree("wsup-layers-", files)


rc, out = run(ROOT)
expect(rc == 0, "the repository follows its layer table", out)

good = {"common/a.h": "", "probes/p.cc": '#include "common/a.h"\n#include <uv.h>\n', "tests/t.cc": '#include "supervisor/s.h"\n',
        "supervisor/s.h": '#include "probes/p.h"\n'}
rc, out = run(tree(good))
expect(rc == 0, "a tree that follows the table passes; tests include anything", out)

up = dict(good, **{"probes/q.cc": '#include "common/a.h"\n  #include "supervisor/config.h"\n'})
rc, out = run(tree(up))
expect(rc == 1 and "probes/q.cc:2: probes/ includes supervisor/config.h" in out, "an upward include is refused with file:line", out)

part = dict(good, **{"front/f.cc": '#include "wire/json_socket.h"\n#include "wire/protocol.h"\n', "wire/json_socket.h": ""})
rc, out = run(tree(part))
expect(rc == 1 and "front/f.cc:2" in out and "wire/protocol.h" in out and "front/f.cc:1" not in out,
       "the front may use only the JSON socket part of wire/", out)

new = dict(good, **{"newlib/x.cc": '#include "common/a.h"\n'})
rc, out = run(tree(new))
expect(rc == 1 and "newlib/: a folder of library code that is not in the layer table" in out,
       "a folder not in the table is refused until it is placed", out)

apart = dict(good, **{"bench/b.cc": '#include "testkit/k.h"\n#include "tests/t.h"\n', "tests/u.cc": '#include "bench/b.h"\n',
                      "testkit/k.h": '#include "common/a.h"\n'})
rc, out = run(tree(apart))
expect(rc == 1 and "bench/b.cc:2: bench/ includes tests/t.h" in out and "tests/u.cc:1: tests/ includes bench/b.h" in out
       and "bench/b.cc:1" not in out, "tests/ and bench/ share code only through testkit/", out)

print("check_layers: all cases passed")
