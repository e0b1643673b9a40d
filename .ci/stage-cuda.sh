#!/usr/bin/env bash
# CI stage: the CUDA backend without a GPU. StarPU with CUDA (and FxT) into a
# prefix under the build tree (scripts/build-starpu.sh --cuda; nothing to do
# when it is there already), relaymoe with -DRMOE_CUDA=ON against it, a check
# with cuobjdump that every kernel has sm_90 code and PTX
# (scripts/check-cuda-arch.py; cuobjdump from its PyPI wheel, the toolkit
# here has none), the quick, cuda-host, gpu and trace labels on that build (a
# CUDA build must run correctly where there is no GPU; the gpu label skips
# itself), and
# bench/gpu/run.sh --dry-run on a bundle of bench/gpu/pack.sh.
#   RMOE_BUILD_DIR   the main build tree (default build/)
#   CUDA_HOME        the CUDA toolkit (default /usr/local/cuda)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${RMOE_BUILD_DIR:-$here/build}
cuda=${CUDA_HOME:-/usr/local/cuda}
prefix=$build/starpu-cuda
cuda_build=$build/relaymoe-cuda
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }
[ -x "$cuda/bin/nvcc" ] || { echo "stage-cuda: no nvcc in $cuda (the CUDA 13 toolkit; CUDA_HOME)" >&2; exit 1; }
# pip fetches cuobjdump; pack.sh bundles Debian's reference BLAS.
RMOE_SETUP_EXTRA="python3-pip libblas3" "$here/scripts/setup.sh"

"$here/scripts/build-starpu.sh" --prefix "$prefix" --cuda --fxt
echo "stage-cuda: StarPU with CUDA in $prefix ($(since))"
cmake -S "$here" -B "$cuda_build" -DRMOE_CUDA=ON -DRMOE_STARPU_PREFIX="$prefix" \
  -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DCMAKE_BUILD_TYPE="${RMOE_BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build "$cuda_build" -j"$(nproc)" >"$cuda_build/build.log" 2>&1 ||
  { tail -n 30 "$cuda_build/build.log" >&2; echo "stage-cuda: the CUDA build failed" >&2; exit 1; }
if grep -E "warning" "$cuda_build/build.log" >&2; then echo "stage-cuda: the CUDA build has warnings" >&2; exit 1; fi
echo "stage-cuda: relaymoe with CUDA codelets in $cuda_build ($(since))"
# Its StarPU has FxT: the trace tests below record and read real traces
# (the only CI stage that does; scripts/build-fxt.sh does it on a CPU-only
# StarPU), never just the refusal without FxT.
grep -q '^#define RMOE_STARPU_HAS_FXT 1' "$cuda_build/generated/rmoe_config.h" ||
  { echo "stage-cuda: relaymoe did not find FxT in the StarPU of $prefix" >&2; exit 1; }

# Every kernel with sm_90 code and PTX.
tools=$build/cuobjdump
if [ ! -x "$tools/nvidia/cu13/bin/cuobjdump" ]; then
  rm -rf "$tools" && mkdir -p "$tools"
  /usr/bin/python3 -m pip download -q --no-deps --only-binary=:all: --dest "$tools" "nvidia-cuda-cuobjdump>=13,<14"
  /usr/bin/python3 -c "import glob, sys, zipfile; zipfile.ZipFile(glob.glob(sys.argv[1] + '/*.whl')[0]).extractall(sys.argv[1])" "$tools"
  chmod +x "$tools/nvidia/cu13/bin/cuobjdump"
fi
python3 "$here/scripts/check-cuda-arch.py" --cuobjdump "$tools/nvidia/cu13/bin/cuobjdump" \
  --sources "$here/codelets/kernels" "$cuda_build/apps/relaymoe" "$cuda_build/librelaymoe.so"
echo "stage-cuda: sm_90 code checked ($(since))"

# The CUDA build where there is no GPU: the quick label (the unit tests and
# every dispatcher at 2 ranks, forward, backward, bf16, task errors), the
# CUDA kernels on the host shim (cuda-host), the GPU checks that skip
# themselves (gpu) and the FxT traces (trace, trace_np2 among them). The rest of the suite reruns
# on CPU workers the same C code the main suite has run (the codelets' CPU
# functions, the graph, the planner), and CI must stay well under its time
# limit on two cores.
ctest --test-dir "$cuda_build" --output-on-failure --timeout 600 -j"${RMOE_TEST_JOBS:-2}" \
  -L 'quick|cuda-host|gpu|trace'
echo "stage-cuda: the suite on the CUDA build ($(since))"

# The GPU script itself, on CPU workers, from a bundle as a GPU machine gets
# it; one round of the layer's cases (a second reruns the same cases through
# the same loop: 45 s of CI's time).
"$here/bench/gpu/pack.sh" --build "$cuda_build" --starpu "$prefix" --out "$build/gpu-bundle"
"$here/bench/gpu/run.sh" --dry-run --rounds 1 --build "$build/gpu-bundle" "$build/gpu-dry-run"
echo "stage-cuda: done ($(since))"
