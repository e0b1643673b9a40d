#!/usr/bin/env python3
"""Checks that every CUDA kernel of relaymoe has sm_90 machine code (and
PTX, for later GPUs) in the given binaries, with cuobjdump from the CUDA
toolkit (or its PyPI wheel, nvidia-cuda-cuobjdump: .ci/stage-cuda.sh):

  check-cuda-arch.py [--cuobjdump PATH] [--arch sm_90] --sources DIR FILE...

The kernels expected are the __global__ functions of DIR/*.cu (and .cuh);
each must appear in an sm_90 ELF of the fatbin of some FILE, every ELF of
every FILE must be for sm_90, and every PTX entry must have its sm_90 code.
Prints one line per file; exits 1 on any miss."""
import argparse
import glob
import os
import re
import subprocess
import sys


def run(cuobjdump, flag, path):
    p = subprocess.run([cuobjdump, flag, path], capture_output=True, text=True)
    if p.returncode != 0 and "does not contain device code" not in p.stderr:
        sys.exit(f"check-cuda-arch: {cuobjdump} {flag} {path}: {p.stderr.strip()[:300]}")
    return p.stdout


def elf_kernels(text):
    """{arch: set of kernel symbols} of the fatbin's ELF parts."""
    out, arch, in_elf = {}, None, False
    for line in text.splitlines():
        if line.startswith("Fatbin elf code"):
            in_elf, arch = True, None
        elif line.startswith("Fatbin ptx code"):
            in_elf = False
        m = re.match(r"arch = (\S+)", line)
        if m and in_elf:
            arch = m.group(1)
            out.setdefault(arch, set())
        if in_elf and arch:
            for name in re.findall(r"(?<!rela)\.text\.([A-Za-z0-9_]+)", line):
                out[arch].add(name)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuobjdump", default="cuobjdump")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--sources", required=True)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    expected = set()
    for src in glob.glob(os.path.join(a.sources, "*.cu")) + glob.glob(os.path.join(a.sources, "*.cuh")):
        with open(src) as f:
            expected |= set(re.findall(r"__global__\s+void\s+([A-Za-z0-9_]+)", f.read()))
    if not expected:
        sys.exit(f"check-cuda-arch: no __global__ kernel in {a.sources}")
    seen, problems = set(), []
    for path in a.files:
        elves = elf_kernels(run(a.cuobjdump, "-elf", path))
        ptx = set(re.findall(r"\.entry\s+([A-Za-z0-9_]+)", run(a.cuobjdump, "-ptx", path)))
        other = sorted(arch for arch in elves if arch != a.arch)
        if other:
            problems.append(f"{path}: ELF for {', '.join(other)}, not only {a.arch}")
        native = elves.get(a.arch, set())
        missing = sorted(ptx - native)
        if missing:
            problems.append(f"{path}: PTX entries without {a.arch} code: {', '.join(missing[:5])}")
        if native and not ptx:
            problems.append(f"{path}: {a.arch} code but no PTX (later GPUs could not run it)")
        for k in expected:
            if any(re.search(r"\d" + re.escape(k) + r"(I|E|v|l|P|i|$)", n) or n == k for n in native):
                seen.add(k)
        print(f"{path}: {len(native)} kernels with {a.arch} code, {len(ptx)} PTX entries")
    absent = sorted(expected - seen)
    if absent:
        problems.append(f"kernels of {a.sources} with no {a.arch} code in any file: {', '.join(absent)}")
    for p in problems:
        print("FAIL " + p)
    print(f"check-cuda-arch: {len(seen)} of {len(expected)} kernels of {a.sources} have {a.arch} code"
          f"{'' if problems else ', every one'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
