#!/usr/bin/env python3
"""Tests of scripts/check_test_names.py: the repository's test names are
whole for CTest, and the checker refuses a ';' in a name, also in a
fixture's test and across joined literals."""
import script_check
from script_check import ROOT, expect


def run(root):
    return script_check.run("check_test_names.py", root)


def tree(text):
    return script_check.tree("wsup-names-", {"tests/a_test.cc": text})


rc, out = run(ROOT)
expect(rc == 0, "the repository's test names have no ';'", out)

rc, out = run(tree('TEST_CASE("fine, with a comma", "[x]") {}\nTEST_CASE("a; b", "[x]") {}\n'))
expect(rc == 1 and "a_test.cc:2:" in out and "'a; b'" in out, "a plain TEST_CASE with ';' is named", out)

rc, out = run(tree('TEST_CASE_METHOD(Fixture, "one;"\n                 " two", "[x]") {}\n'))
expect(rc == 1 and "'one; two'" in out, "a fixture's test with ';' in joined literals is named", out)

rc, out = run(tree('TEST_CASE("--flag-like name", "[x]") {}\n'))
expect(rc == 1 and "leading '-'" in out, "a name that starts with '-' is named", out)

rc, out = run(tree('TEST_CASE("clean", "[x]") {}\n'))
expect(rc == 0, "a clean tree passes", out)

rc, out = run(tree("int main() {}\n"))
expect(rc == 1 and "no TEST_CASE" in out, "a tree without tests is an error, not a pass", out)
print("ok")
