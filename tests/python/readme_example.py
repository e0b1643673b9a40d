#!/usr/bin/python3
"""Prints an example of a Markdown document (the README or a file of docs/):
the indented code block whose first line is FIRST_LINE, without its
indentation, so that the tests run the documented examples as written.
  readme_example.py DOC FIRST_LINE
"""
import sys


def example(readme, first_line):
    lines = open(readme).read().split("\n")
    for i, line in enumerate(lines):
        if line == "    " + first_line and (i == 0 or not lines[i - 1].strip()):
            block = []
            for l in lines[i:]:
                if l and not l.startswith("    "):
                    break
                block.append(l[4:])
            while block and not block[-1].strip():
                block.pop()
            return "\n".join(block) + "\n"
    raise SystemExit(f"readme_example.py: no code block starting with {first_line!r} in {readme}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.stdout.write(example(sys.argv[1], sys.argv[2]))
