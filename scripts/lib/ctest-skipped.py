#!/usr/bin/env python3
"""Lists the tests of a ctest run that did not run: skipped (exit 77) or not
run (a fixture or dependency failed, disabled), each with its labels and the
reason it printed, then the labels of which some or all tests did not run.
Reads the run's JUnit file (ctest --output-junit) and the labels of
`ctest --show-only=json-v1`. Always exits 0: the run's status is ctest's.

    ctest-skipped.py BUILD_DIR JUNIT_FILE
"""
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

# Open MPI's own reports (a rank's non-zero exit) sit between dashed lines.
DASHES = re.compile(r"^-{20,}$")


def labels_of(build):
    out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], capture_output=True,
                         text=True, check=False).stdout
    try:
        tests = json.loads(out).get("tests", [])
    except ValueError:
        return {}
    labels = {}
    for t in tests:
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels[t["name"]] = [str(v) for v in p.get("value", [])]
    return labels


def reason(output, message):
    """The last line the test printed outside Open MPI's reports."""
    lines, inside = [], False
    for line in (output or "").splitlines():
        if DASHES.match(line.strip()):
            inside = not inside
            continue
        if not inside and line.strip():
            lines.append(line.strip())
    said = lines[-1] if lines else "no reason printed"
    if len(said) > 150:
        said = said[:147] + "..."
    if message and message != "SKIP_RETURN_CODE=77":
        return f"{message}: {said}" if lines else message
    return said


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 0
    build, junit = sys.argv[1], sys.argv[2]
    try:
        cases = ET.parse(junit).getroot().iter("testcase")
    except (OSError, ET.ParseError) as e:
        print(f"test.sh: no list of skipped tests ({junit}: {e})")
        return 0
    labels = labels_of(build)
    ran, missed = [], []
    for case in cases:
        ran.append(case.get("name", "?"))
        status = case.get("status", "run")
        if status not in ("notrun", "disabled"):
            continue
        skipped = case.find("skipped")
        message = skipped.get("message", "") if skipped is not None else status
        out = case.findtext("system-out", default="")
        name = case.get("name", "?")
        missed.append((name, labels.get(name, []), reason(out, message)))
    if not missed:
        print(f"test.sh: all {len(ran)} tests ran, none skipped")
        return 0
    print(f"test.sh: {len(missed)} of {len(ran)} tests did not run:")
    width = max(len(n) for n, _, _ in missed)
    lwidth = max(len(",".join(ls) or "-") for _, ls, _ in missed)
    for name, ls, why in missed:
        print(f"  {name:<{width}}  {(','.join(ls) or '-'):<{lwidth}}  {why}")
    per_label = {}
    for name in ran:
        for label in labels.get(name, []):
            per_label.setdefault(label, [0, 0])[0] += 1
    for _, ls, _ in missed:
        for label in ls:
            per_label.setdefault(label, [0, 0])[1] += 1
    summary = [f"{label} ({n_missed} of {n} tests)" for label, (n, n_missed) in sorted(per_label.items()) if n_missed]
    print("test.sh: labels with tests that did not run: " + ", ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
