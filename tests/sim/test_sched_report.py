#!/usr/bin/python3
"""The committed policy-sweep reports against their own data.

bench/results/sim_sched.md (ring and all-to-all) and
bench/results/sim_sched_a2a/sim_sched.md (the all-to-all's sweep) are made
by bench/sim/sched_report.py. Each is regenerated here from the CSV committed
beside it: the CSV must come back unchanged and the report identical from its
determinism section on (the head holds the command line, an argument). The
all-to-all's rows of the combined report must be those of its own sweep, and
the report must be refused, with nothing written, when a run is given twice or
a file is not a sweep's rows. No StarPU needed: a few seconds.

  test_sched_report.py SOURCE_DIR WORK_DIR
"""
import csv
import os
import shutil
import subprocess
import sys

src, work = sys.argv[1], sys.argv[2]
report = os.path.join(src, "bench", "sim", "sched_report.py")
results = os.path.join(src, "bench", "results")
fails = []


def check(ok, what):
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    if not ok:
        fails.append(what)


def run(out, *rows):
    cmd = [sys.executable, report, "--out", out, "--cmd", "test", "--date", "test", "--preset", "Qwen3-30B-A3B",
           "--scale", "8", "--cluster", os.path.join(src, "scheduler", "clusters", "mn5-acc.cluster"),
           "--wall", "0", "--jobs", "1"]
    for r in rows:
        cmd += ["--rows", r]
    return subprocess.run(cmd, capture_output=True, text=True)


def from_determinism(path):
    text = open(path).read()
    return text[text.index("## Determinism"):]


def rows_of(path, dispatch=None):
    return [r for r in csv.DictReader(open(path)) if dispatch is None or r["dispatch"] == dispatch]


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
combined = os.path.join(results, "sim_sched.csv")
a2a = os.path.join(results, "sim_sched_a2a", "sim_sched.csv")

for name, d in (("combined", results), ("a2a", os.path.join(results, "sim_sched_a2a"))):
    out = os.path.join(work, name)
    os.makedirs(out)
    if os.path.exists(os.path.join(d, "sim_sched_notes.md")):
        shutil.copy(os.path.join(d, "sim_sched_notes.md"), out)
    p = run(out, os.path.join(d, "sim_sched.csv"))
    check(p.returncode == 0, "%s report regenerates (%s)" % (name, p.stderr.strip()))
    if p.returncode:
        continue
    check(open(os.path.join(out, "sim_sched.csv")).read() == open(os.path.join(d, "sim_sched.csv")).read(),
          "%s: sim_sched.csv comes back unchanged" % name)
    check(from_determinism(os.path.join(out, "sim_sched.md")) == from_determinism(os.path.join(d, "sim_sched.md")),
          "%s: sim_sched.md identical from its determinism section on" % name)
    eps = sorted({int(r["ep"]) for r in rows_of(os.path.join(d, "sim_sched.csv"))})
    check(all(os.path.exists(os.path.join(out, "sim_sched_ep%d.png" % ep)) for ep in eps),
          "%s: a plot per EP (%s)" % (name, eps))

# The combined report holds both dispatchers at every EP of the sweep, and
# its all-to-all rows are the all-to-all sweep's.
c = rows_of(combined)
check({r["dispatch"] for r in c} == {"ring", "a2a"}, "combined report has ring and a2a rows")
for d in ("ring", "a2a"):
    check(sorted({int(r["ep"]) for r in c if r["dispatch"] == d}) == [8, 16, 32, 64],
          "combined report: %s at EP 8, 16, 32 and 64" % d)
check(rows_of(combined, "a2a") == rows_of(a2a), "combined report's a2a rows equal the a2a sweep's")
text = open(os.path.join(results, "sim_sched.md")).read()
check("did not:" not in text and "Every case (%d) gave identical" % len({
    (r["ep"], r["dispatch"], r["policy"], r["prio"]) for r in c}) in text,
    "combined report: every case identical in its rounds")

# Refusals: a run given twice, and a file that is not a sweep's rows, exit
# non-zero with a message naming the problem and write no report.
for what, rows, expect in (("a run given twice", (combined, a2a), "given twice"),
                           ("a file that is not a sweep's rows",
                            (os.path.join(src, "README.md"),), "neither sched.sh's rows nor a sim_sched.csv")):
    out = os.path.join(work, "refused-" + expect.split()[0])
    os.makedirs(out)
    p = run(out, *rows)
    check(p.returncode != 0 and expect in p.stderr and not os.listdir(out),
          "%s refused, nothing written (rc %d: %s)" % (what, p.returncode, p.stderr.strip()))

if fails:
    print("%d check(s) failed" % len(fails))
    sys.exit(1)
print("all checks passed")
