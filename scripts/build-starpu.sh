#!/usr/bin/env bash
# Builds StarPU 1.3 from Debian's source package (the same version as the
# system's libstarpu-dev) into a prefix, with the features Debian's binary
# packages lack. relaymoe then builds against it with
#   cmake -DRMOE_STARPU_PREFIX=DIR ...
#
#   scripts/build-starpu.sh --prefix DIR [--fxt] [--cuda] [--idle-yield] [--simgrid] [--jobs N] [--work DIR]
#
#   --prefix DIR   where to install (required)
#   --fxt          FxT traces (STARPU_USE_FXT): relaymoe run --trace
#   --cuda         CUDA workers and cuBLAS (STARPU_USE_CUDA) with the toolkit in
#                  $CUDA_HOME (default /usr/local/cuda); CUDA 13 needs the three
#                  changes of scripts/starpu-cuda13.patch. relaymoe then builds
#                  its CUDA codelets with cmake -DRMOE_CUDA=ON. On a machine
#                  without a GPU the build runs CPU workers only.
#   --idle-yield   an idle CPU worker yields its core (sched_yield) instead of
#                  spinning on "pause": with more threads than cores (several
#                  ranks on a small machine) the MPI progress thread then gets
#                  the core at once; bench/results/hop.md measures it
#   --simgrid      SimGrid simulation (STARPU_SIMGRID) with StarPU-MPI over
#                  SimGrid's SMPI: static libraries, only src, mpi and tools
#                  built; relaymoe then builds relaymoe-sim with
#                  cmake -DRMOE_SIMGRID=ON (bench/sim/)
#   --jobs N       parallel make jobs (default: nproc)
#   --work DIR     where the source is unpacked and built (default: DIR.work)
#
# Idempotent: when the prefix already holds a build with the same features
# it does nothing. Debian packages it needs (and a deb-src entry for
# bookworm when none is configured) are installed as root, or through sudo.
# Further features (CUDA, SimGrid) each add one flag: a case in the option
# loop, their configure arguments and packages in the feature block below.
set -euo pipefail

prefix=
work=
jobs=$(nproc)
fxt=0
cuda=0
idle_yield=0
simgrid=0

die() { echo "build-starpu: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a directory"; prefix=$2; shift 2 ;;
    --work) [ $# -ge 2 ] || die "--work needs a directory"; work=$2; shift 2 ;;
    --jobs) [ $# -ge 2 ] || die "--jobs needs a count"; jobs=$2; shift 2 ;;
    --fxt) fxt=1; shift ;;
    --cuda) cuda=1; shift ;;
    --idle-yield) idle_yield=1; shift ;;
    --simgrid) simgrid=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (expected --prefix DIR, --fxt, --cuda, --idle-yield, --simgrid, --jobs N, --work DIR)" ;;
  esac
done
[ -n "$prefix" ] || die "--prefix DIR is required"
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
work=${work:-$prefix.work}

# Only what relaymoe uses: the core library, StarPU-MPI and the tools.
# Everything else (docs, examples, tests, Fortran, FFT, OpenCL, SOCL, the
# resource manager, the OpenMP runtime, the MLR models' bundled LAPACK) is
# off, which keeps a 2-core build to a few minutes.
config=(--enable-mpi --disable-static --disable-build-doc --disable-build-examples
        --disable-build-tests --disable-fortran --disable-starpufft --disable-opencl
        --disable-socl --disable-starpurm --disable-openmp --disable-mlr --disable-hdf5
        --disable-glpk --disable-valgrind --enable-maxcpus=64)
packages=(build-essential pkg-config dpkg-dev libhwloc-dev libopenmpi-dev openmpi-bin)
features=()
# Subdirectories built and installed one by one; empty: the whole tree.
subdirs=()
# Patches (-p1) applied to the pristine source for this build.
here=$(cd "$(dirname "$0")" && pwd)
patches=()
# ---- features ---------------------------------------------------------------
if [ "$fxt" -eq 1 ]; then
  config+=(--with-fxt)
  packages+=(libfxt-dev)
  features+=(fxt)
fi
if [ "$cuda" -eq 1 ]; then
  [ "$simgrid" -eq 0 ] || die "--cuda and --simgrid: the simulation has simulated GPUs of its own"
  cuda_home=${CUDA_HOME:-/usr/local/cuda}
  [ -x "$cuda_home/bin/nvcc" ] || die "--cuda: no nvcc in $cuda_home/bin (set CUDA_HOME to the CUDA toolkit)"
  config+=(--with-cuda-dir="$cuda_home")
  features+=(cuda)
  patches+=("$here/starpu-cuda13.patch")
fi
if [ "$idle_yield" -eq 1 ]; then
  features+=(idle-yield)
fi
if [ "$simgrid" -eq 1 ]; then
  # StarPU-MPI over SMPI links statically only. Simulated CUDA workers
  # exist without the CUDA driver (the codelets mark .cuda_funcs under
  # STARPU_SIMGRID); a 64-rank platform needs 64 as the CPU limit.
  # xsltproc is what starpu_smpirun merges platform files with.
  config=("${config[@]/--disable-static/--disable-shared}")
  config+=(--enable-simgrid)
  packages+=(libsimgrid-dev xsltproc patch)
  features+=(simgrid)
  # Only the libraries and starpu_smpirun: the dfsg source lacks files
  # some examples need, and the rest of the tree doubles the build time.
  subdirs=(src mpi/src tools)
  # StarPU-MPI sends a vector as a contiguous derived datatype, which SMPI
  # copies through a malloc'd buffer of the whole message: real memory and
  # memcpy time for data that is folded. The patch sends vectors as bytes.
  # It also lets SimGrid free the actor StarPU-MPI starts to wait for each
  # request once it ends: StarPU kept a reference to every one for a join
  # that never comes, and with it the actor's stack (0.5 GB of memory and
  # 0.35 GB of page tables for a 64-rank layer at 1/4 size, bench/results/sim.md).
  patches+=("$here/starpu-simgrid-mpi.patch")
fi
# CUDA is off unless a feature flag turns it on: configure would otherwise
# pick up any toolkit it finds.
case " ${config[*]} " in
  *" --with-cuda-dir="*) ;;
  *) config+=(--disable-cuda) ;;
esac
# -----------------------------------------------------------------------------

stamp="$prefix/.relaymoe-starpu"
want="starpu 1.3 features: ${features[*]:-none}; configure: ${config[*]}"
for p in "${patches[@]}"; do want="$want; patch $(basename "$p") $(cksum <"$p" | cut -d' ' -f1)"; done
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$prefix/lib/pkgconfig/starpumpi-1.3.pc" ]; then
  echo "build-starpu: $prefix already has StarPU (features: ${features[*]:-none})"
  exit 0
fi

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else die "needs root (or sudo) to run: $*"
  fi
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-starpu: installing ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The source: Debian's package of the installed StarPU version, patches applied.
src=$(find "$work" -maxdepth 1 -type d -name 'starpu-1.3.*' 2>/dev/null | sort | tail -n 1 || true)
if [ -z "$src" ]; then
  if ! grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "build-starpu: adding a deb-src entry for Debian bookworm"
    as_root tee /etc/apt/sources.list.d/relaymoe-debian-src.sources >/dev/null <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    as_root apt-get update -qq
  fi
  mkdir -p "$work"
  # As root apt warns that it downloads unsandboxed: harmless here. A
  # deb-src entry whose index was never fetched needs one apt-get update.
  fetch() { (cd "$work" && apt-get source -qq starpu 2>&1 >/dev/null | grep -v 'unsandboxed' >&2 || true); }
  fetch
  src=$(find "$work" -maxdepth 1 -type d -name 'starpu-1.3.*' | sort | tail -n 1)
  if [ -z "$src" ]; then
    as_root apt-get update -qq
    fetch
    src=$(find "$work" -maxdepth 1 -type d -name 'starpu-1.3.*' | sort | tail -n 1)
  fi
  [ -n "$src" ] || die "apt-get source starpu left no starpu-1.3.* folder in $work"
fi
echo "build-starpu: source $src"
# StarPU 1.3's idle worker backs off with "rep; nop" (src/common/utils.h),
# which keeps its core busy; --idle-yield makes that a sched_yield. The
# source is patched or restored to match the flag, so one work folder serves
# both builds.
utils=$src/src/common/utils.h
[ -f "$utils.orig" ] || cp "$utils" "$utils.orig"
cp "$utils.orig" "$utils"
if [ "$idle_yield" -eq 1 ]; then
  sed -i 's|^#define _STARPU_UYIELD() __asm__ __volatile("rep; nop")$|#define _STARPU_UYIELD() sched_yield()|' "$utils"
  grep -q '^#define _STARPU_UYIELD() sched_yield()$' "$utils" ||
    die "--idle-yield: $utils does not define _STARPU_UYIELD as expected"
  grep -q '^#include <sched.h>' "$utils" || die "--idle-yield: $utils does not include <sched.h>"
fi

# Patched files are restored from their pristine copies first, so one work
# folder serves builds with and without the patches.
for p in "${patches[@]}"; do
  for f in $(sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$p"); do
    [ -f "$src/$f.rmoe-orig" ] || cp "$src/$f" "$src/$f.rmoe-orig"
  done
done
for o in $(find "$src" -name '*.rmoe-orig'); do cp "$o" "${o%.rmoe-orig}"; done
for p in "${patches[@]}"; do
  patch -s -p1 -d "$src" <"$p" || die "patch $p does not apply to $src"
done

build="$work/build"
rm -rf "$build"
mkdir -p "$build"
echo "build-starpu: configure ${config[*]}"
(cd "$build" && "$src/configure" --prefix="$prefix" "${config[@]}" >configure.log 2>&1) ||
  { tail -n 30 "$build/configure.log" >&2; die "configure failed (log: $build/configure.log)"; }
if [ "$fxt" -eq 1 ]; then
  grep -q '^#define STARPU_USE_FXT 1' "$build/src/common/config.h" ||
    die "configure did not enable FxT (log: $build/configure.log)"
fi
if [ "$cuda" -eq 1 ]; then
  grep -q '^#define STARPU_USE_CUDA 1' "$build/src/common/config.h" ||
    die "configure did not enable CUDA (log: $build/configure.log)"
fi
if [ "$simgrid" -eq 1 ]; then
  grep -q '^#define STARPU_SIMGRID 1' "$build/src/common/config.h" ||
    die "configure did not enable SimGrid (log: $build/configure.log)"
  grep -q '^#define STARPU_USE_MPI 1' "$build/src/common/config.h" ||
    die "configure did not enable StarPU-MPI over SMPI (log: $build/configure.log)"
fi
echo "build-starpu: make -j$jobs ${subdirs[*]:-}"
if [ ${#subdirs[@]} -eq 0 ]; then
  make -C "$build" -j"$jobs" >"$build/make.log" 2>&1 ||
    { tail -n 30 "$build/make.log" >&2; die "make failed (log: $build/make.log)"; }
  make -C "$build" install >"$build/install.log" 2>&1 ||
    { tail -n 30 "$build/install.log" >&2; die "make install failed (log: $build/install.log)"; }
else
  : >"$build/make.log"
  for d in "${subdirs[@]}"; do
    make -C "$build/$d" -j"$jobs" >>"$build/make.log" 2>&1 ||
      { tail -n 30 "$build/make.log" >&2; die "make in $d failed (log: $build/make.log)"; }
  done
  # Each directory's own files, then the top level's and mpi's headers and
  # pkg-config files, which belong to no built subdirectory.
  {
    for d in "${subdirs[@]}"; do make -C "$build/$d" install || exit 1; done
    make -C "$build" install-versincludeHEADERS install-nodist_versincludeHEADERS install-pkgconfigDATA &&
      make -C "$build/mpi" install-versincludeHEADERS install-pkgconfigDATA
  } >"$build/install.log" 2>&1 ||
    { tail -n 30 "$build/install.log" >&2; die "make install failed (log: $build/install.log)"; }
fi
echo "$want" >"$stamp"
echo "build-starpu: installed into $prefix (features: ${features[*]:-none})"
