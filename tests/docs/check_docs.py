#!/usr/bin/python3
"""Keeps README.md and docs/ true to the tree they describe:
- every repository path they name (in inline code and code blocks: a token
  whose first component is an entry of the repository's root) exists, globs
  and <placeholders> matching at least one file;
- every relative link (and image) reaches a file, and its #anchor a heading;
- every docs/*.md is linked from the README, and opens with a sentence after
  its title;
- the README has at most 150 lines (a newcomer reads it in five minutes);
- the README's and docs' cheap commands (`build/apps/relaymoe` with --help,
  --blas-core, or plan: one process, no StarPU started) exit 0;
- no text file of bench/results/ names a local checkout path;
- docs/tuning.md names every RMOE_* variable of system/environment.c's
  table, the one place the library and its programs read them.
  check_docs.py SOURCE_DIR RELAYMOE_APP
"""
import glob
import os
import re
import shlex
import subprocess
import sys

README_MAX_LINES = 150
LOCAL_PATH = re.compile(r"(?<![\w.~-])(/work|/home|/root|/tmp|/Users|/scratch|/mnt|/data)/")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
APP = "build/apps/relaymoe"

fails = []


def fail(msg):
    fails.append(msg)
    print("FAIL: " + msg)


def blocks(text):
    """(prose paragraphs, code lines) of a Markdown file: indented and fenced
    code blocks apart from the rest."""
    prose, code, para = [], [], []
    fenced = False
    prev_blank = True
    in_indented = False
    for line in text.split("\n"):
        if line.strip().startswith("```"):
            fenced = not fenced
            prev_blank = False
            continue
        if fenced:
            code.append(line)
            continue
        if line.startswith("    ") and (prev_blank or in_indented) and not para:
            in_indented = True
            code.append(line[4:])
            prev_blank = False
            continue
        if not line.strip():
            if para:
                prose.append(" ".join(para))
                para = []
            prev_blank = True
            if in_indented:
                code.append("")
            continue
        in_indented = False
        prev_blank = False
        para.append(line.strip())
    if para:
        prose.append(" ".join(para))
    return prose, code


def commands(code):
    """Code-block lines joined over trailing backslashes, comments dropped."""
    out, cur = [], ""
    for line in code:
        line = re.sub(r"\s+#.*$", "", line) if not line.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


def tokens(s):
    for t in s.split():
        t = t.strip("`'\",;:()[]{}")
        if "=" in t:
            t = t.rsplit("=", 1)[1]
        if t.startswith("./"):
            t = t[2:]
        yield t.rstrip(".,;:)")


def repo_path(t, roots):
    if "/" not in t or "://" in t or t[0] in "/$~-.<" and not t.startswith(".ci/"):
        return None
    first = t.split("/", 1)[0]
    return t if first in roots else None


def exists(src, path):
    pattern = re.sub(r"<[^>]*>", "*", path)
    if any(c in pattern for c in "*?["):
        return bool(glob.glob(os.path.join(src, pattern)))
    return os.path.exists(os.path.join(src, pattern))


def slug(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text):
    seen, out = {}, set()
    for line in text.split("\n"):
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else "%s-%d" % (s, n))
    return out


def cheap(cmd):
    if not cmd.startswith(APP + " ") and cmd != APP:
        return False
    if any(c in cmd for c in "|&;<>$`"):
        return False
    argv = shlex.split(cmd)[1:]
    return bool(argv) and (argv[0] == "plan" or "--help" in argv or argv == ["--blas-core"])


def main(src, app):
    roots = {e for e in os.listdir(src) if not e.startswith("build") and e != ".git"}
    readme = os.path.join(src, "README.md")
    docs = sorted(glob.glob(os.path.join(src, "docs", "*.md")))
    files = [readme] + docs
    texts = {f: open(f, encoding="utf-8").read() for f in files}

    # One version: the C header's; the Python package states the same.
    header = open(os.path.join(src, "include", "relaymoe", "relaymoe.h"), encoding="utf-8").read()
    parts = [re.search(r"#define RMOE_VERSION_%s (\d+)" % k, header) for k in ("MAJOR", "MINOR", "PATCH")]
    c_version = ".".join(m.group(1) for m in parts) if all(parts) else None
    init = open(os.path.join(src, "python", "relaymoe", "__init__.py"), encoding="utf-8").read()
    m = re.search(r'^__version__ = "([^"]+)"', init, re.M)
    if not c_version or not m or m.group(1) != c_version:
        fail("python/relaymoe/__init__.py __version__ %s, relaymoe.h RMOE_VERSION_* %s: they must be equal"
             % (m.group(1) if m else "missing", c_version or "missing"))

    n_lines = texts[readme].count("\n")
    if n_lines > README_MAX_LINES:
        fail("README.md has %d lines: at most %d" % (n_lines, README_MAX_LINES))

    n_paths = n_links = 0
    linked = set()
    runs = []
    for f in files:
        name = os.path.relpath(f, src)
        prose, code = blocks(texts[f])
        spans = [s for p in prose for s in re.findall(r"`([^`]+)`", p)]
        for t in (t for s in spans + code for t in tokens(s)):
            p = repo_path(t, roots)
            if p:
                n_paths += 1
                if not exists(src, p):
                    fail("%s names %s, which does not exist" % (name, p))
        for target in (m.group(1) for p in prose for m in LINK.finditer(p)):
            if re.match(r"[a-z]+:", target):
                continue
            n_links += 1
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not os.path.exists(dest):
                fail("%s links to %s, which does not exist" % (name, target))
                continue
            if f == readme:
                linked.add(os.path.relpath(dest, src))
            if anchor and dest.endswith(".md"):
                text = texts.get(dest) or open(dest, encoding="utf-8").read()
                if anchor not in anchors(text):
                    fail("%s links to %s: no heading #%s in %s" % (name, target, anchor,
                                                                   os.path.relpath(dest, src)))
        runs += [c for c in commands(code) + spans if cheap(c)]

    for d in docs:
        rel = os.path.relpath(d, src)
        if rel not in linked:
            fail("%s is not linked from README.md" % rel)
        lines = [l for l in texts[d].split("\n") if l.strip()]
        if len(lines) < 2 or not lines[0].startswith("# ") or lines[1][0] in "#|`-* ":
            fail("%s does not open with a title and a sentence saying what it holds" % rel)

    runs = list(dict.fromkeys(runs))
    readme_runs = [c for c in runs if c in texts[readme]]
    if len(readme_runs) < 2:
        fail("README.md names %d cheap command(s) to run; expected --help and plan at least"
             % len(readme_runs))
    for c in runs:
        argv = [app] + shlex.split(c)[1:]
        try:
            p = subprocess.run(argv, cwd=src, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=120, universal_newlines=True)
            rc, out = p.returncode, p.stdout
        except subprocess.TimeoutExpired:
            rc, out = "timeout", ""
        if rc != 0:
            fail("`%s` exited %s:\n%s" % (c, rc, out[-2000:]))

    n_results = 0
    for root, _, names in os.walk(os.path.join(src, "bench", "results")):
        for n in names:
            f = os.path.join(root, n)
            try:
                text = open(f, encoding="utf-8").read()
            except UnicodeDecodeError:
                continue
            n_results += 1
            for i, line in enumerate(text.split("\n"), 1):
                m = LOCAL_PATH.search(line)
                if m:
                    fail("%s:%d names a local path (%s...): use a repository-relative one"
                         % (os.path.relpath(f, src), i, line[m.start():m.start() + 40]))

    env = open(os.path.join(src, "system", "environment.c"), encoding="utf-8").read()
    tuning = open(os.path.join(src, "docs", "tuning.md"), encoding="utf-8").read()
    knobs = re.findall(r'\{"(RMOE_[A-Z0-9_]+)",', env)
    if not knobs:
        fail("system/environment.c: no RMOE_* variable found in its table")
    for k in knobs:
        if "`%s`" % k not in tuning:
            fail("docs/tuning.md does not list %s, an environment variable system/environment.c reads" % k)

    print("check_docs: %d files, README %d lines, %d paths, %d links, %d commands run, "
          "%d results files; %d problem(s)" % (len(files), n_lines, n_paths, n_links, len(runs),
                                               n_results, len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])))
