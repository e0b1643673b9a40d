#!/usr/bin/env bash
# Builds two commits of relaymoe and checks that `relaymoe run --deterministic
# --dump` writes byte-identical .npy files with both, for ring, token and the
# all-to-alls (Megatron's, DeepEP's) at 1, 3 and 4 ranks (plus a chunked ring
# and a shared expert): the check that a restructuring changed no result.
# A revision from before the lean all-to-all (its run has no a2a-megatron)
# ran Megatron's graph as a2a: that is what a2a-megatron is compared with.
# The lean a2a is compared likewise where both revisions have it; otherwise
# HEAD's runs with --check (against the reference) only. So are the cases
# named in $RMOE_SAME_CHECK_ONLY (e.g. "a2a"), for a change that reorders a
# dispatcher's additions on purpose (the pipelined a2a adds its chunks as
# they arrive: the same sums in another order).
#
#   scripts/dev/same-outputs.sh BASE [HEAD]     (HEAD defaults to the work tree)
#
# BASE and HEAD are git revisions; "worktree" (the default HEAD) means the
# checkout as it is, uncommitted changes included. Builds go to
# $RMOE_SAME_DIR (default /tmp/relaymoe-same); prints one line per case and
# exits 1 when any file differs.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
base=${1:?usage: same-outputs.sh BASE [HEAD]}
head=${2:-worktree}
work=${RMOE_SAME_DIR:-/tmp/relaymoe-same}
mkdir -p "$work"

build_rev() { # rev dir -> prints the relaymoe binary
  local rev=$1 dir=$2 src
  if [ "$rev" = worktree ]; then
    src=$here
  else
    src=$dir/src
    rm -rf "$src"
    git -C "$here" worktree remove --force "$src" >/dev/null 2>&1 || true
    git -C "$here" worktree add --detach "$src" "$rev" >/dev/null 2>&1
  fi
  cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRMOE_BUILD_TESTS=OFF >/dev/null
  cmake --build "$dir/build" -j"$(nproc)" >/dev/null
  echo "$dir/build/apps/relaymoe"
}

echo "same-outputs: building $base and $head"
bin_a=$(build_rev "$base" "$work/a")
bin_b=$(build_rev "$head" "$work/b")

export STARPU_SILENT=1 STARPU_NCPU=1 STARPU_WORKERS_NOBIND=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export STARPU_HOME=$work/starpu-home
mkdir -p "$STARPU_HOME"
layer=(--hidden 64 --ffn 48 --experts 12 --topk 4 --tokens 128 --seed 7 --repeat 1 --quiet --deterministic)
# Megatron's all-to-all: a2a-megatron, or a2a before the lean one existed.
megatron_of() { local help; help=$("$1" run --help 2>&1 || true); if [[ "$help" == *a2a-megatron* ]]; then echo a2a-megatron; else echo a2a; fi; }
megatron_a=$(megatron_of "$bin_a")
megatron_b=$(megatron_of "$bin_b")
# BASE's dispatchers, read once (a grep -q on a pipe under pipefail may see
# the writer's SIGPIPE as a failure).
help_a=$("$bin_a" run --help 2>&1 || true)
fail=0
for np in 1 3 4; do
  for case in ring token a2a-megatron a2a a2a-deepep ring-chunked ring-shared; do
    extra=()
    case $case in
      ring-chunked) d=ring; extra=(--chunk-rows 40) ;;
      ring-shared) d=ring; extra=(--shared-ffn 32) ;;
      *) d=$case ;;
    esac
    # A revision without the dispatcher (a2a-deepep came later) is not
    # compared: HEAD's runs against the reference, as below.
    if { [ "$case" = a2a ] && [ "$megatron_a" = a2a ]; } || [[ " ${RMOE_SAME_CHECK_ONLY:-} " == *" $case "* ]] ||
       [[ "$help_a" != *"$d"* ]]; then
      # BASE has no lean a2a to compare with, or its order of additions
      # changed: HEAD's against the reference.
      log=$work/log-b-$np-$case
      if mpirun -np "$np" --oversubscribe --bind-to none "$bin_b" run "${layer[@]}" --dispatch "$d" "${extra[@]}" --check >"$log" 2>&1 &&
         grep -q "check $d vs reference.*PASS" "$log"; then
        printf 'same-outputs: %-13s %d rank(s): --check PASS (not compared with %s)\n' "$case" "$np" "$base"
      else
        printf 'same-outputs: %-13s %d rank(s): --check FAILED: %s\n' "$case" "$np" "$log"
        fail=1
      fi
      continue
    fi
    for side in a b; do
      bin=bin_$side
      ds=$d
      [ "$case" = a2a-megatron ] && { m=megatron_$side; ds=${!m}; }
      out=$work/out-$side-$np-$case
      rm -rf "$out"
      mpirun -np "$np" --oversubscribe --bind-to none "${!bin}" run "${layer[@]}" --dispatch "$ds" "${extra[@]}" --dump "$out" >"$work/log-$side-$np-$case" 2>&1 ||
        { echo "same-outputs: $side failed for $case at $np rank(s): $work/log-$side-$np-$case" >&2; exit 2; }
    done
    n=0 diff=()
    for f in "$work/out-a-$np-$case"/*.npy; do
      n=$((n + 1))
      cmp -s "$f" "$work/out-b-$np-$case/$(basename "$f")" || diff+=("$(basename "$f")")
    done
    if [ ${#diff[@]} -eq 0 ] && [ "$n" -gt 0 ]; then
      printf 'same-outputs: %-13s %d rank(s): %2d files identical\n' "$case" "$np" "$n"
    else
      printf 'same-outputs: %-13s %d rank(s): DIFFERENT: %s\n' "$case" "$np" "${diff[*]:-no files}"
      fail=1
    fi
  done
done
[ "$base" = worktree ] || git -C "$here" worktree remove --force "$work/a/src" >/dev/null 2>&1 || true
[ "$head" = worktree ] || git -C "$here" worktree remove --force "$work/b/src" >/dev/null 2>&1 || true
exit $fail
