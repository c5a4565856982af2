#!/usr/bin/env python3
"""Checks that every Catch2 test name in the tests reaches CTest whole.

catch_discover_tests registers each TEST_CASE under its name, and CTest
reads a ';' in a name as a list separator: the test then runs as two
filters that match nothing and passes empty (the reserve test of the
carver once did); a name that starts with '-' is read by the test
binary as an option and runs nothing; a backslash is read by Catch2 as an
escape, so the name CTest passes back matches no test. This reads every TEST_CASE, TEST_CASE_METHOD and
SCENARIO name under ROOT/tests (adjacent string literals joined, as the
compiler joins them) and names each file, line and test that has one.

  scripts/check_test_names.py [ROOT]     # exit 1 and one line per bad name
"""
import os
import re
import sys

# The macro, an optional fixture argument, then the name's literals.
MACRO = re.compile(r'\b(TEST_CASE_METHOD|TEST_CASE|SCENARIO)\s*\(\s*(?:[A-Za-z_][\w:<>, ]*?,\s*)?((?:"(?:[^"\\]|\\.)*"\s*)+)')
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
BAD = {";": "a ';' (CTest splits names there)",
       # An escaped backslash in the literal: the name has a backslash.
       "\\\\": "a backslash (Catch2 reads it as an escape in the name CTest passes back, and matches nothing)"}
# Catch2 reads a name that starts with '-' as an option of its own.
LEADING = {"-": "a leading '-' (Catch2 takes it for a command-line option)"}


def names(text):
    for m in MACRO.finditer(text):
        name = "".join(LITERAL.findall(m.group(2)))
        yield text.count("\n", 0, m.start()) + 1, name


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    bad = []
    seen = 0
    for top, _, files in os.walk(os.path.join(root, "tests")):
        for f in sorted(files):
            if not f.endswith((".cc", ".cpp", ".h")):
                continue
            path = os.path.join(top, f)
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            for line, name in names(text):
                seen += 1
                rel = os.path.relpath(path, root)
                for ch, why in BAD.items():
                    if ch in name:
                        bad.append(f"{rel}:{line}: test '{name}' has {why}; use ',' or ':' instead")
                for ch, why in LEADING.items():
                    if name.startswith(ch):
                        bad.append(f"{rel}:{line}: test '{name}' has {why}; start it with a word")
    for b in bad:
        print(b)
    if seen == 0:
        print(f"{root}/tests: no TEST_CASE found; pass the repository root")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
