"""What the bench reports share (bench/memory/summarize.py, bench/sim/report.py,
bench/rate/report.py): the fixed text they take from docs/report-text/, a
Markdown table row, matplotlib without a display, and the report's file.

Each report is made in three steps: load its inputs into plain records,
compute its figures (pure functions over those records), render them (the
CSV/JSON files, the plots, then the Markdown). The Markdown's fixed prose,
what explains the method, the paper or a caveat rather than states a
figure, is kept in docs/report-text/NAME.md, where it can be read and
edited as text; a renderer inserts it verbatim, figures filled in by name.
"""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT_DIR = os.path.join(ROOT, "docs", "report-text")
MARKER = re.compile(r"^<!-- text: ([\w-]+) -->$")

_docs = {}


def _sections(doc):
    """{section: [lines]} of docs/report-text/DOC.md: a section runs from its
    marker line to the next, blank lines at either end left out."""
    if doc not in _docs:
        out, cur = {}, None
        with open(os.path.join(TEXT_DIR, doc + ".md"), encoding="utf-8") as f:
            for line in f.read().split("\n"):
                m = MARKER.match(line)
                if m:
                    cur = out.setdefault(m.group(1), [])
                elif cur is not None:
                    cur.append(line)
        for lines in out.values():
            while lines and not lines[-1].strip():
                lines.pop()
            while lines and not lines[0].strip():
                lines.pop(0)
        _docs[doc] = out
    return _docs[doc]


def text(doc, section, **values):
    """The lines of SECTION of docs/report-text/DOC.md; with values, each
    {name} in them replaced by its value (a literal brace is written twice)."""
    sections = _sections(doc)
    if section not in sections:
        raise KeyError("docs/report-text/%s.md has no section '%s'" % (doc, section))
    lines = sections[section]
    return [line.format_map(values) for line in lines] if values else list(lines)


def text1(doc, section, **values):
    """A one-line section, as a string to build a line from."""
    lines = text(doc, section, **values)
    if len(lines) != 1:
        raise ValueError("docs/report-text/%s.md: section %s has %d lines, 1 expected" % (doc, section, len(lines)))
    return lines[0]


def row(cells):
    """One Markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def pyplot():
    """matplotlib.pyplot drawing to files only (no display on the machines
    the benchmarks run on)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_lines(path, lines):
    """The report: its lines, each ended by a newline."""
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
