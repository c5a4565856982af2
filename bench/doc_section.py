#!/usr/bin/env python3
"""Replaces (or appends) one section of a Markdown file.

    bench/doc_section.py DOC "## Heading" BODY_FILE

The section runs from the heading line to the next heading of the same or a
higher level; it becomes the heading, a blank line and BODY_FILE's text. The
file is written to a temporary name and renamed.
"""
import os
import sys


def level(line):
    return len(line) - len(line.lstrip("#")) if line.startswith("#") else 0


def main():
    doc, heading, body_file = sys.argv[1], sys.argv[2].strip(), sys.argv[3]
    body = open(body_file, encoding="utf-8").read().strip("\n")
    lines = open(doc, encoding="utf-8").read().split("\n") if os.path.exists(doc) else []
    new = [heading, "", body, ""]
    lvl = level(heading)
    start = next((i for i, l in enumerate(lines) if l.strip() == heading), None)
    if start is None:
        while lines and lines[-1] == "":
            lines.pop()
        lines += [""] + new
    else:
        end = start + 1
        in_code = False
        while end < len(lines):
            l = lines[end]
            if l.startswith("```"):
                in_code = not in_code
            elif not in_code and 0 < level(l) <= lvl:
                break
            end += 1
        lines[start:end] = new
    tmp = doc + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")
    os.replace(tmp, doc)


if __name__ == "__main__":
    main()
