#!/usr/bin/env bash
# What one ring hop's transfer costs through StarPU-MPI against plain MPI,
# 4 KB to 256 MB, under the settings that decide it on a small machine:
#   default          mpirun -np 2 as it comes (each rank bound to one core)
#   bind-none        --bind-to none (scripts/mpirun.sh does this)
#   bind-none+yield  and --mca mpi_yield_when_idle 1 (spinning MPI polls yield)
#   ...+split4M      and each buffer sent as handles of at most 4 MB
# Each variant is one run of hop_bench (plain MPI and StarPU-MPI side by side
# in it); rounds alternate over the variants so all see the same machine.
# HOP_ALT_PREFIX=DIR adds the last variant built against the StarPU in DIR
# (label HOP_ALT_LABEL). Writes bench/results/hop.csv, hop.md, hop.png.
#   bench/hop/run.sh [ROUNDS]        (default 2)
#   RMOE_STARPU_PREFIX   StarPU to build against (default: the system's)
#   HOP_SIZES            e.g. 4K,1M,64M (default 4K..256M, x4 steps)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${1:-2}
out=$here/bench/results
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sizes=${HOP_SIZES:-4K,16K,64K,256K,1M,4M,16M,64M,256M}
export STARPU_HOME=${STARPU_HOME:-$work/starpu-home}
export STARPU_SILENT=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$STARPU_HOME" "$out"

build() {  # prefix output
  local pc=()
  [ -n "$1" ] && pc=(env PKG_CONFIG_PATH="$1/lib/pkgconfig:${PKG_CONFIG_PATH:-}")
  # shellcheck disable=SC2046
  mpicc -O2 -std=gnu11 -Wall -Wextra "$here/bench/hop/hop_bench.c" -o "$2" \
    $("${pc[@]}" pkg-config --cflags --libs starpumpi-1.3 starpu-1.3) \
    $([ -n "$1" ] && echo "-Wl,-rpath,$1/lib")
}
build "${RMOE_STARPU_PREFIX:-}" "$work/hop_bench"
root=()
[ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
mpirun_=(mpirun "${root[@]}" -np 2 -x STARPU_HOME -x STARPU_SILENT -x OPENBLAS_NUM_THREADS)
variants=(
  "default||"
  "bind-none|--bind-to none|"
  "bind-none+yield|--bind-to none --mca mpi_yield_when_idle 1|"
  "bind-none+yield+split4M|--bind-to none --mca mpi_yield_when_idle 1|--split 4M"
)
if [ -n "${HOP_ALT_PREFIX:-}" ]; then
  build "$HOP_ALT_PREFIX" "$work/hop_bench_alt"
  variants+=("${HOP_ALT_LABEL:-alt StarPU}|--bind-to none --mca mpi_yield_when_idle 1|ALT")
fi

csv=$work/hop.csv
for r in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    IFS='|' read -r label mflags bflags <<<"$v"
    exe=$work/hop_bench
    if [ "$bflags" = ALT ]; then exe=$work/hop_bench_alt; bflags=""; fi
    echo "== round $r: $label"
    # shellcheck disable=SC2086
    "${mpirun_[@]}" $mflags "$exe" --sizes "$sizes" --reps 3 $bflags --label "$label" --csv "$work/r.csv"
    # the round in front of every row of this run
    [ -s "$csv" ] || head -n 1 "$work/r.csv" | sed 's/^/round,/' >"$csv"
    tail -n +2 "$work/r.csv" | sed "s/^/$r,/" >>"$csv"
    rm -f "$work/r.csv"
  done
done
cp "$csv" "$out/hop.csv"
/usr/bin/python3 "$here/bench/hop/report.py" "$out/hop.csv" "$out/hop.png" \
  --command "bench/hop/run.sh $rounds" >"$out/hop.md"
cat "$out/hop.md"
