#!/usr/bin/env bash
# Packs what bench/gpu/run.sh needs on a GPU machine where nothing can be
# installed (../shared/notes/starpu-cuda.md): the programs of a relaymoe
# build made with -DRMOE_CUDA=ON, in the build tree's layout, and beside them
# in lib/ the shared libraries that machine lacks: StarPU (the CUDA build of
# scripts/build-starpu.sh --cuda), FxT, CMocka, and a CBLAS. The CBLAS is
# Debian's reference BLAS under OpenBLAS's file name (OpenBLAS alone is
# 36 MB; on the GPU the CPU GEMMs only serve the small reference checks).
# --strip drops the debug sections (symbols stay, for backtraces): the
# bundle shrinks from about 28 to 12 MB, room for more beside it in a call.
#   bench/gpu/pack.sh --build DIR --starpu PREFIX --out DIR [--strip]
set -euo pipefail
build= starpu= out= strip=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --starpu) starpu=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --strip) strip=1; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "pack.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$build" ] && [ -n "$starpu" ] && [ -n "$out" ] || { echo "pack.sh: --build, --starpu and --out are needed" >&2; exit 2; }
grep -q "RMOE_CUDA:BOOL=ON" "$build/CMakeCache.txt" 2>/dev/null \
  || { echo "pack.sh: $build is not a relaymoe build with -DRMOE_CUDA=ON" >&2; exit 2; }
progs=(apps/relaymoe tests/unit/test_codelets tests/unit/test_codelets_router tests/unit/test_codelets_dispatch
       tests/unit/test_codelets_expert tests/unit/test_codelets_bf16 tests/mpi/test_raw bench/gpu/rmoe_gemm_rate)
for p in "${progs[@]}"; do [ -x "$build/$p" ] || { echo "pack.sh: $build/$p missing: build it first" >&2; exit 2; }; done
blas=/usr/lib/x86_64-linux-gnu/blas/libblas.so.3
[ -e "$blas" ] || { echo "pack.sh: $blas missing: apt-get install libblas3" >&2; exit 2; }

tmp=$(mktemp -d "${out%/}.tmp.XXXX")
trap 'rm -rf "$tmp"' EXIT
for p in "${progs[@]}"; do mkdir -p "$tmp/$(dirname "$p")"; cp "$build/$p" "$tmp/$p"; done
mkdir -p "$tmp/lib"
cp -L "$starpu/lib/libstarpu-1.3.so.9" "$starpu/lib/libstarpumpi-1.3.so.3" "$tmp/lib/"
lib() { cp -L "/lib/x86_64-linux-gnu/$1" "$tmp/lib/$1"; }
for l in libfxt.so.2 libcmocka.so.0 libgfortran.so.5 libquadmath.so.0; do
  [ -e "/lib/x86_64-linux-gnu/$l" ] && lib "$l"
done
cp -L "$blas" "$tmp/lib/libopenblas.so.0"
if [ $strip = 1 ]; then
  for f in "${progs[@]/#/$tmp/}" "$tmp"/lib/*; do chmod u+w "$f"; strip --strip-debug "$f"; done
fi
# Every program must load against the bundle (plus the system's MPI, hwloc
# and CUDA, which the GPU machine has).
for p in "${progs[@]}"; do
  if LD_LIBRARY_PATH=$tmp/lib ldd "$tmp/$p" | grep -q "not found"; then
    echo "pack.sh: $p: $(LD_LIBRARY_PATH=$tmp/lib ldd "$tmp/$p" | grep "not found" | head -3)" >&2; exit 1
  fi
done
git -C "$(dirname "$0")" rev-parse HEAD > "$tmp/COMMIT" 2>/dev/null || true
rm -rf "$out" && mv "$tmp" "$out"
trap - EXIT
echo "pack.sh: $out: $(du -sh "$out" | cut -f1) ($(ls "$out/lib" | tr '\n' ' '))"
