#!/usr/bin/env python3
"""Checks that the library's layers stay honest (README, "Layout"):

- The layers, bottom up: include < base < scheduler < system < simmpi <
  codelets < graph. base/ is what every layer stands on (errors, hashes);
  scheduler/ the pure planner; system/ what reads this process's machine
  (host probes, files, the environment, hwloc); simmpi/ the simulation
  build's MPI over StarPU-MPI.
- include/, base/, scheduler/ and system/ include neither StarPU nor MPI
  (include's relaymoe_mpi.h aside); codelets/kernels/ includes no StarPU;
  codelets/ no MPI; graph/ no BLAS; <hwloc.h> only in system/. <starpu*.h>
  appears only in simmpi/, codelets/ and graph/.
- Inside codelets/ and graph/, folders by concern, bottom up: codelets/
  kernels/ < probe/ < runtime/ < the codelets at its top; graph/ context/ <
  pass/ < dispatch/ < the layer at its top. A file includes and calls only
  its own folder's files and those of the folders below it.
- No folder of the library or apps/ holds more than MAX_FOLDER_FILES
  source files.
- An RMOE_* environment variable is read in system/environment.c only
  (its table names them all; docs/tuning.md lists them).
- No file of the library or apps/ but the dispatchers' two tables
  (scheduler/dispatchers.c, graph/dispatch/table.c) compares a dispatch
  with an RMOE_DISPATCH_* constant (==, !=, case): they ask the rows.
- A layer includes only its own headers and those of the layers below it;
  private headers (codelets/ outside codelets/include/, graph/*.h) only
  from their own folder.
- No include cycle between library files.
- Calls: a file calls no function (nor takes its address) of a layer above
  its own, and no two library files call each other, directly or through
  others (a call cycle between files). The call graph: which file defines
  each function that is not static, and which files name it, also through
  the inline functions and function-like macros of the headers they use.
- The planner (scheduler/) and base/ call nothing outside themselves and
  base/, and none of the C library's calls that read or change the machine
  (environment, files, clocks, threads, hwloc): a plan depends only on its
  inputs.
- No file of the library or apps/ over 600 lines; no function there over
  80 lines unless the comment at its head says why it is long (a line with
  "Long:").

Prints every violation and exits 1 when there is one."""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
LAYERS = ["include", "base", "scheduler", "system", "simmpi", "codelets", "graph"]
# The folders by concern inside a layer, bottom up ("" is the layer's top).
FOLDERS = {"codelets": ["kernels", "probe", "runtime", ""], "graph": ["context", "pass", "dispatch", ""]}
# Held to the sizes, not the layering: the programs.
SIZED_ONLY = ["apps"]
MAX_FOLDER_FILES = 20
ENVIRONMENT = os.path.join("system", "environment.c")
DISPATCH_TABLES = {os.path.join("scheduler", "dispatchers.c"), os.path.join("graph", "dispatch", "table.c")}
DISPATCH_TEST = re.compile(r"(==|!=)\s*RMOE_DISPATCH_[A-Z_]+|RMOE_DISPATCH_[A-Z_]+\s*(==|!=)|\bcase\s+RMOE_DISPATCH_")
RANK = {name: i for i, name in enumerate(LAYERS)}
# What each layer's files may call besides the C library and the runtimes.
PURE = {"base": {"base"}, "scheduler": {"scheduler", "base"}}
# The C library's and hwloc's calls that a pure layer must not make.
IMPURE_CALL = re.compile(r"(getenv|secure_getenv|setenv|unsetenv|putenv|f?open|opendir|readdir|mkdir|stat|lstat|"
                         r"access|unlink|rename|sysconf|getrlimit|getrusage|gethostname|clock_gettime|time|"
                         r"gettimeofday|mallinfo2?|pthread_\w+|hwloc_\w+)$")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80

problems = []


def source_files(layers):
    for layer in layers:
        for dirpath, _, names in os.walk(os.path.join(ROOT, layer)):
            for n in sorted(names):
                if n.endswith((".c", ".h", ".cu", ".cuh")):
                    yield os.path.relpath(os.path.join(dirpath, n), ROOT)


files = sorted(source_files(LAYERS))
text = {}
for f in files:
    with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
        text[f] = fh.read()
by_base = {}
for f in files:
    by_base.setdefault(os.path.basename(f), []).append(f)
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of(path):
    return path.split(os.sep)[0]


def folder_rank(path):
    """The rank of path's folder by concern inside its layer, or None where
    the layer has no such folders (include/, base/, ...)."""
    parts = path.split(os.sep)
    order = FOLDERS.get(parts[0])
    if order is None:
        return None
    if len(parts) > 2 and parts[1] == "include":
        return -1  # the layer's interface, below every folder
    sub = parts[1] if len(parts) > 2 and parts[1] in order else ""
    if len(parts) > 2 and parts[1] not in order:
        problems.append(f"{path}: in {parts[0]}/{parts[1]}/, which is none of {parts[0]}/'s folders "
                        f"({', '.join(o + '/' for o in order if o)})")
    return order.index(sub)


def below_or_same(f, t, what):
    """A problem when f, in a folder by concern, reaches t in a folder above
    its own inside the same layer."""
    if layer_of(f) != layer_of(t):
        return
    rf, rt = folder_rank(f), folder_rank(t)
    if rf is not None and rt is not None and rt > rf:
        problems.append(f"{f}: {what} {t}, in a folder above its own in {layer_of(f)}/")


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
    for no, line in enumerate(text[f].split("\n"), 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        kind, name = m.groups()
        where = f"{f}:{no}"
        system = kind == "<"
        if system and re.match(r"starpu", name):
            if layer not in ("simmpi", "codelets", "graph") or kernel:
                problems.append(f"{where}: <{name}> outside simmpi/, codelets/ and graph/ (or in the plain kernels)")
        if system and name == "mpi.h":
            if layer in ("base", "scheduler", "system", "codelets") or (
                    layer == "include" and not f.endswith("relaymoe_mpi.h")):
                problems.append(f"{where}: <mpi.h> in {layer}/, which knows no MPI")
        if system and name in ("cblas.h", "cublas_v2.h") and layer == "graph":
            problems.append(f"{where}: <{name}> in graph/, which knows no BLAS")
        if system and name == "hwloc.h" and layer != "system":
            problems.append(f"{where}: <hwloc.h> in {layer}/: only system/ reads the machine")
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
        below_or_same(f, t, "includes")
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

# ---- the call graph ------------------------------------------------------------


def code_only(src):
    """src without comments, string and character literals (newlines kept)."""
    out = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    out = re.sub(r"//[^\n]*", "", out)
    return re.sub(r'"(\\.|[^"\\\n])*"|\'(\\.|[^\'\\\n])*\'', '""', out)


IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def functions(lines):
    """(name, first line, "{" line, "}" line, signature) of each function
    defined as the style writes them: a signature from column 0, "{" alone
    at column 0 under it, its body up to the next "}" at column 0."""
    for i, line in enumerate(lines):
        if line != "{" or i == 0 or not lines[i - 1].rstrip().endswith(")"):
            continue
        start = i - 1
        while start > 0 and lines[start][:1] in (" ", "\t"):
            start -= 1
        end = i + 1
        while end < len(lines) and lines[end] != "}":
            end += 1
        signature = " ".join(lines[start:i])
        m = re.search(r"([A-Za-z_]\w*)\s*\(", signature)
        if m:
            yield m.group(1), start, i, end, signature


code = {f: code_only(text[f]) for f in files}
defined = {}   # non-static function -> the files defining it
for f in files:
    if f.endswith((".c", ".cu")):
        for name, _, _, _, sig in functions(code[f].split("\n")):
            if not re.search(r"\bstatic\b", sig):
                defined.setdefault(name, set()).add(f)

# What a header's inline functions and function-like macros name, so that a
# file using one calls what it calls.
expands = {}
for f in files:
    if not f.endswith((".h", ".cuh")):
        continue
    lines = code[f].split("\n")
    for name, _, brace, end, sig in functions(lines):
        if re.search(r"\binline\b", sig):
            expands.setdefault(name, set()).update(IDENT.findall(" ".join(lines[brace:end])))
    for m in re.finditer(r"^\s*#\s*define\s+([A-Za-z_]\w*)\(([^\n]*\\\n)*[^\n]*", code[f], flags=re.M):
        expands.setdefault(m.group(1), set()).update(IDENT.findall(m.group(0)[len(m.group(1)):]))


def names_used(f):
    """Every identifier f names, header inline functions and macros expanded."""
    seen = set()
    todo = IDENT.findall(code[f])
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo.extend(expands.get(n, ()))
    return seen


calls = {f: {} for f in files}   # caller -> callee file -> one function named
names = {}
for f in files:
    if not f.endswith((".c", ".cu")):
        continue
    names[f] = names_used(f)
    for n in sorted(names[f]):
        for t in defined.get(n, ()):
            if t != f:
                calls[f].setdefault(t, n)

for f in sorted(calls):
    layer = layer_of(f)
    for t, n in sorted(calls[f].items()):
        if RANK[layer_of(t)] > RANK[layer]:
            problems.append(f"{f}: calls {n} of {t}, a layer above {layer}/")
        below_or_same(f, t, f"calls {n} of")
        if layer in PURE and layer_of(t) not in PURE[layer]:
            problems.append(f"{f}: calls {n} of {t}: {layer}/ calls only {', '.join(sorted(PURE[layer]))}/")
    if layer in PURE:
        bad = sorted(n for n in names.get(f, ()) if IMPURE_CALL.match(n) and n not in defined
                     and re.search(r"\b" + n + r"\s*\(", code[f]))
        if bad:
            problems.append(f"{f}: calls {', '.join(bad)}: {layer}/ reads nothing of the machine (system/ does)")

# Call cycles between files: the strongly connected components of the file
# graph (Tarjan), each reported with one cycle through it.
index, low, on_stack, stack, sccs = {}, {}, set(), [], []


def strongconnect(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in calls[v]:
        if w not in index:
            strongconnect(w)
            low[v] = min(low[v], low[w])
        elif w in on_stack:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on_stack.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))


sys.setrecursionlimit(10000)
for f in sorted(calls):
    if f not in index:
        strongconnect(f)


def cycle_through(comp):
    """A shortest call path from comp's first file back to it."""
    first, members = comp[0], set(comp)
    paths = {first: [first]}
    queue = [first]
    while queue:
        v = queue.pop(0)
        for w in sorted(calls[v]):
            if w == first:
                return paths[v] + [first]
            if w in members and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return comp


for comp in sccs:
    path = cycle_through(comp)
    hops = [f"{a} ({calls[a][b]}) -> {b}" if i == 0 else f"({calls[a][b]}) -> {b}"
            for i, (a, b) in enumerate(zip(path, path[1:]))]
    problems.append("call cycle: " + " ".join(hops))

# Sizes. The comment right above a function's signature is its head.
sized = files + sorted(source_files(SIZED_ONLY))
for f in sized:
    if f not in text:
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            text[f] = fh.read()
folders = {}
for f in sized:
    folders.setdefault(os.path.dirname(f), []).append(f)
for d, members in sorted(folders.items()):
    if len(members) > MAX_FOLDER_FILES:
        problems.append(f"{d}/: {len(members)} source files, more than {MAX_FOLDER_FILES}: split it by concern")
for f in sized:
    if f != ENVIRONMENT and re.search(r'getenv\s*\(\s*"RMOE_', text[f]):
        problems.append(f"{f}: reads an RMOE_ variable with getenv: read it through rmoe_env ({ENVIRONMENT})")
    if f not in DISPATCH_TABLES and f.endswith((".c", ".cu")):
        for no, line in enumerate(code_only(text[f]).split("\n"), 1):
            if DISPATCH_TEST.search(line):
                problems.append(f"{f}:{no}: tests a dispatch against an RMOE_DISPATCH_* constant: ask its row "
                                f"(rmoe_dispatcher_of, scheduler/rmoe_dispatchers.h)")
for f in sized:
    lines = text[f].split("\n")
    if len(lines) - 1 > MAX_FILE_LINES:
        problems.append(f"{f}: {len(lines) - 1} lines, more than {MAX_FILE_LINES}")
    for name, start, _, end, _ in functions(lines):
        length = end - start + 1
        head = []
        j = start - 1
        while j >= 0 and lines[j].lstrip().startswith(("/*", "*")):
            head.append(lines[j])
            j -= 1
        if length > MAX_FUNCTION_LINES and not any("Long:" in h for h in head):
            problems.append(f"{f}:{start + 1}: {name} is {length} lines (more than {MAX_FUNCTION_LINES}, and the "
                            f"comment at its head does not say why: 'Long: ...')")

for p in problems:
    print(p)
print(f"check_layers: {len(files)} library files and {len(sized) - len(files)} of apps/, {sum(len(e) for e in edges.values())} includes and "
      f"{sum(len(c) for c in calls.values())} calling pairs between them, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
