#!/usr/bin/env bash
# bench/gpu/run.sh outside --dry-run where there is no GPU: it must stop
# within 60 s with a non-zero status, naming what is missing, and measure
# nothing. Two cases on a bundle laid out from BUILD_DIR (any relaymoe
# build: the CPU one serves):
#   1. the machine as it is: nvidia-smi (when absent) and the CUDA worker
#      named, and nothing but run.log written;
#   2. stand-ins for nvidia-smi and compute-sanitizer on PATH, and one
#      carried program that needs a library found only in a stand-in for
#      PyTorch's nvidia/<lib>/lib folders: the preflight reports the GPU,
#      adds that folder to the library path, and still stops on StarPU
#      finding no CUDA worker.
# Skipped (77) on a machine with a GPU, where run.sh would run for real.
#   run_sh_no_gpu.sh SOURCE_DIR BUILD_DIR CC
set -uo pipefail
src=$1 build=$2 cc=$3
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "run_sh_no_gpu: this machine has a GPU: the no-GPU path is not testable here"; exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# case NAME OUT ENV...: run.sh on the bundle, its status, time and output.
run_case() {
  local name=$1 out=$2; shift 2
  local t0=$SECONDS
  log=$(env "$@" timeout 90 "$src/bench/gpu/run.sh" --build "$work/bundle" "$out" 2>&1); rc=$?
  took=$((SECONDS - t0))
  echo "--- $name: exit $rc after $took s"
  echo "$log"
  [ $rc -ne 0 ] && ok "$name: non-zero exit ($rc)" || bad "$name: exit 0 without a GPU"
  [ $rc -ne 124 ] && [ $took -le 60 ] && ok "$name: ended within 60 s ($took s)" || bad "$name: took $took s"
  local extra='' f
  for f in "$out"/*; do [ "$f" = "$out/run.log" ] || extra+=" ${f##*/}"; done
  [ -z "$extra" ] && ok "$name: nothing but run.log written" || bad "$name: wrote $extra"
}
expect() { # expect NAME REGEX: the output names it
  grep -qE "$2" <<<"$log" && ok "$1: names '$2'" || bad "$1: does not name '$2'"
}

# The bundle: the build's programs where they are, one stand-in below.
mkdir -p "$work/bundle"
for d in apps tests bench lib; do [ -e "$build/$d" ] && ln -s "$build/$d" "$work/bundle/$d"; done
[ -x "$build/apps/relaymoe" ] || { echo "run_sh_no_gpu: no $build/apps/relaymoe: build first"; exit 1; }

run_case "no GPU" "$work/out1"
command -v nvidia-smi >/dev/null || expect "no GPU" "MISSING: nvidia-smi"
expect "no GPU" "MISSING: a CUDA worker: StarPU found none"

# Case 2: a GPU that StarPU cannot use, and a library only PyTorch has.
mkdir -p "$work/stubs" "$work/site/nvidia/fake/lib" "$work/bundle2/tests/mpi"
printf '#!/bin/sh\necho "NVIDIA H200, 143771 MiB, 580.159.04, 1980 MHz"\n' >"$work/stubs/nvidia-smi"
printf '#!/bin/sh\nexec "$@"\n' >"$work/stubs/compute-sanitizer"
chmod +x "$work/stubs/"*
echo 'int rmoe_fake(void) { return 0; }' >"$work/fake.c"
echo 'int rmoe_fake(void); int main(void) { return rmoe_fake(); }' >"$work/main.c"
"$cc" -shared -fPIC -Wl,-soname,librmoe_fake.so.1 -o "$work/site/nvidia/fake/lib/librmoe_fake.so.1" "$work/fake.c" &&
  "$cc" -o "$work/bundle2/tests/mpi/test_raw" "$work/main.c" "$work/site/nvidia/fake/lib/librmoe_fake.so.1" ||
  { echo "run_sh_no_gpu: $cc cannot build the stand-in program"; exit 1; }
rm -rf "$work/bundle/tests"
mkdir -p "$work/bundle/tests"
for d in "$build"/tests/*; do [ "$(basename "$d")" = mpi ] || ln -s "$d" "$work/bundle/tests/"; done
mv "$work/bundle2/tests/mpi" "$work/bundle/tests/mpi"
run_case "GPU StarPU cannot use" "$work/out2" PATH="$work/stubs:$PATH" PYTHONPATH="$work/site"
expect "GPU StarPU cannot use" "found: GPU NVIDIA H200"
expect "GPU StarPU cannot use" "found: compute-sanitizer"
expect "GPU StarPU cannot use" "found: librmoe_fake.so.1 in $work/site/nvidia/fake/lib \(added to the library path\)"
expect "GPU StarPU cannot use" "MISSING: a CUDA worker: StarPU found none"
grep -q "MISSING: librmoe_fake" <<<"$log" && bad "the library in PyTorch's folder still reported missing"

echo "run_sh_no_gpu: $fails check(s) failed"
[ $fails -eq 0 ]
