"""What the tests of the repository's checker scripts (scripts/check_*.py)
share: run a checker on a tree, write a small tree of its own, and stop at
the first failed expectation with the checker's output."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def run(check, root):
    """Runs scripts/<check> on root; returns its exit code and output."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", check), root], capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def tree(prefix, files):
    """A fresh temporary tree holding files ({relative path: text})."""
    d = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, d, True)  # every tree goes when the test ends
    for rel, text in files.items():
        os.makedirs(os.path.join(d, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(d, rel), "w") as f:
            f.write(text)
    return d


def expect(cond, what, out):
    if not cond:
        print(f"FAILED: {what}\n{out}")
        sys.exit(1)
