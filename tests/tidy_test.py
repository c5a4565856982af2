#!/usr/bin/env python3
"""Tests of scripts/tidy.sh: in a small git tree of its own, with the
repository's .clang-tidy, it checks what the latest commit touched, fails
on a finding naming the file and the check, and passes a clean change."""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

if not (shutil.which("clang-tidy") or shutil.which("clang-tidy-14")):
    print("SKIP: clang-tidy is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

d = tempfile.mkdtemp(prefix="wsup-tidy-")
atexit.register(shutil.rmtree, d, True)
os.makedirs(os.path.join(d, "scripts"))
os.makedirs(os.path.join(d, "common"))
os.makedirs(os.path.join(d, "build"))
shutil.copy(os.path.join(ROOT, "scripts", "tidy.sh"), os.path.join(d, "scripts", "tidy.sh"))
shutil.copy(os.path.join(ROOT, ".clang-tidy"), os.path.join(d, ".clang-tidy"))


def write(rel, text):
    with open(os.path.join(d, rel), "w") as f:
        f.write(text)


def git(*args):
    subprocess.run(["git", "-C", d, "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True, timeout=60)


def tidy(base):
    p = subprocess.run(["bash", os.path.join(d, "scripts", "tidy.sh"), base, "build"], capture_output=True,
                       text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def expect(cond, what, out):
    if not cond:
        print(f"FAILED: {what}\n{out}")
        sys.exit(1)


files = ["common/clean.cc", "common/finding.cc"]
write("build/compile_commands.json", json.dumps(
    [{"directory": d, "file": os.path.join(d, f), "command": f"clang++ -std=c++17 -c {os.path.join(d, f)}"}
     for f in files]))
write("common/clean.cc", "int Twice(int x) { return 2 * x; }\n")
git("init", "-q")
git("add", "-A")
git("commit", "-qm", "first")

rc, out = tidy("HEAD")
expect(rc == 0 and "nothing to check" in out, "no change since the base: nothing to check", out)

write("common/clean.cc", "int Twice(int x) { return x + x; }\n")
git("commit", "-qam", "clean change")
rc, out = tidy("HEAD~1")
expect(rc == 0 and "1 file(s) changed" in out and "tidy: clean" in out, "a clean change passes", out)

# An if with an empty statement: bugprone-suspicious-semicolon.
write("common/finding.cc", "int Sign(int x) {\n  if (x < 0);\n  return x;\n}\n")
git("add", "-A")
git("commit", "-qm", "a finding")
rc, out = tidy("HEAD~1")
expect(rc != 0 and "common/finding.cc:2" in out and "bugprone-suspicious-semicolon" in out,
       "a finding fails the run with the file, the line and the check", out)

rc, out = tidy("all")
expect(rc != 0 and "common/finding.cc" in out, "all checks every file, the unchanged ones too", out)

rc, out = subprocess.run(["bash", os.path.join(d, "scripts", "tidy.sh"), "HEAD", "nowhere"], capture_output=True, text=True,
                         timeout=60).returncode, ""
expect(rc == 2, "a tree without compile_commands.json is refused with exit 2", out)

print("tidy: all cases passed")
