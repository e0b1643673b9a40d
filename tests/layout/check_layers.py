#!/usr/bin/env python3
"""Checks that the library's layers stay honest (README, "Layout"):

- scheduler/ and include/ include neither StarPU nor MPI (include's
  relaymoe_mpi.h aside); codelets/kernels/ includes no StarPU; codelets/ no
  MPI; graph/ no BLAS. <starpu*.h> appears only in codelets/ and graph/.
- A layer includes only its own headers and those of the layers below it
  (include < scheduler < codelets < graph); private headers (codelets/
  codelet.h, codelets/kernels/*.h, graph/*.h) only from their own folder.
- No include cycle between library files.
- No library file over 700 lines; no function over 80 lines unless the
  comment at its head says why it is long (a line with "Long:").

Prints every violation and exits 1 when there is one."""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
LAYERS = ["include", "scheduler", "codelets", "graph"]
RANK = {name: i for i, name in enumerate(LAYERS)}
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 80

problems = []


def library_files():
    for layer in LAYERS:
        for dirpath, _, names in os.walk(os.path.join(ROOT, layer)):
            for n in sorted(names):
                if n.endswith((".c", ".h", ".cu", ".cuh")):
                    yield os.path.relpath(os.path.join(dirpath, n), ROOT)


files = sorted(library_files())
by_base = {}
for f in files:
    by_base.setdefault(os.path.basename(f), []).append(f)
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of(path):
    return path.split(os.sep)[0]


def private(path):
    """The folder a private header belongs to, or None for an interface."""
    if path.startswith("graph/") and path.endswith(".h"):
        return "graph/"
    if path.startswith("codelets/") and not path.startswith("codelets/include/"):
        return "codelets/"
    return None


edges = {f: [] for f in files}
for f in files:
    layer = layer_of(f)
    kernel = f.startswith("codelets/kernels/")
    with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    for no, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        kind, name = m.groups()
        where = f"{f}:{no}"
        system = kind == "<"
        if system and re.match(r"starpu", name):
            if layer not in ("codelets", "graph") or kernel:
                problems.append(f"{where}: <{name}> outside codelets/ and graph/ (or in the plain kernels)")
        if system and name == "mpi.h":
            if layer in ("scheduler", "codelets") or (layer == "include" and not f.endswith("relaymoe_mpi.h")):
                problems.append(f"{where}: <mpi.h> in {layer}/, which knows no MPI")
        if system and name in ("cblas.h", "cublas_v2.h") and layer == "graph":
            problems.append(f"{where}: <{name}> in graph/, which knows no BLAS")
        if system:
            continue
        base = os.path.basename(name)
        target = [t for t in by_base.get(base, []) if t.endswith(name)]
        if not target:
            continue  # generated (rmoe_config.h) or outside the library
        t = target[0]
        edges[f].append(t)
        if RANK[layer_of(t)] > RANK[layer]:
            problems.append(f"{where}: {layer}/ includes {t}, a layer above it")
        owner = private(t)
        if owner and not f.startswith(owner):
            problems.append(f"{where}: {t} is private to {owner}")
        if kernel and not t.startswith("codelets/kernels/"):
            problems.append(f"{where}: a plain kernel includes {t}")

# Include cycles (depth-first search).
state = {}


def visit(f, stack):
    state[f] = 1
    stack.append(f)
    for t in edges[f]:
        if state.get(t) == 1:
            problems.append("include cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
        elif t in edges and not state.get(t):
            visit(t, stack)
    stack.pop()
    state[f] = 2


for f in files:
    if not state.get(f):
        visit(f, [])

# Sizes. A function is a "{" alone at column 0 under a signature ending in
# ")"; its body ends at the next "}" at column 0; the comment right above
# the signature is its head.
for f in files:
    with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    if len(lines) - 1 > MAX_FILE_LINES:
        problems.append(f"{f}: {len(lines) - 1} lines, more than {MAX_FILE_LINES}")
    for i, line in enumerate(lines):
        if line != "{" or i == 0 or not lines[i - 1].rstrip().endswith(")"):
            continue
        start = i - 1
        while start > 0 and lines[start][:1] in (" ", "\t"):
            start -= 1
        end = i + 1
        while end < len(lines) and lines[end] != "}":
            end += 1
        length = end - start + 1
        head = []
        j = start - 1
        while j >= 0 and lines[j].lstrip().startswith(("/*", "*")):
            head.append(lines[j])
            j -= 1
        if length > MAX_FUNCTION_LINES and not any("Long:" in h for h in head):
            name = lines[start].split("(")[0].split()[-1].lstrip("*")
            problems.append(f"{f}:{start + 1}: {name} is {length} lines (more than {MAX_FUNCTION_LINES}, and the "
                            f"comment at its head does not say why: 'Long: ...')")

for p in problems:
    print(p)
print(f"check_layers: {len(files)} library files, {sum(len(e) for e in edges.values())} includes between them, "
      f"{len(problems)} problem(s)")
sys.exit(1 if problems else 0)
