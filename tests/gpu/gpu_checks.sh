#!/usr/bin/env bash
# The gpu label: the CUDA codelets against the CPU reference, on a machine
# with an NVIDIA GPU and a relaymoe built with -DRMOE_CUDA=ON. Skipped (77)
# where StarPU finds no CUDA worker, so the whole suite runs anywhere
# (bench/gpu/run.sh counts that skip as a failure).
#   gpu_checks.sh BUILD_DIR MPIEXEC [RESULTS_DIR]
# BUILD_DIR: a relaymoe build tree, or a bundle of bench/gpu/pack.sh (the
# same layout: apps/relaymoe, tests/unit/test_codelets*, tests/mpi/test_raw).
# 1. the test_codelets programs on one CUDA worker and no CPU worker: every codelet
#    against its double-precision loop (fp32 within 1e-5, bf16 within 2e-2
#    of the fp32 kernel), the same tolerances as on the CPU; the expert
#    codelets again in the GEMM ways other than the default
#    (RMOE_CUDA_GEMM=strided, loop; codelets/kernels/cuda_gemm.cuh);
# 2. relaymoe run --check with CUDA workers only, fp32 (1e-5) and bf16
#    (1e-2 relative norm error against the reference), ring, token and
#    all-to-all: one rank with 4 partitions, two ranks sharing the GPU, and
#    CPU and CUDA workers together (data moving between the two); the
#    activations on the device (--io device, and the _raw calls against the
#    float32 calls bit for bit); and the device's peak memory reported;
# 3. compute-sanitizer's memcheck over one layer run (every launcher of a
#    pass); with GPU_CHECKS_SANITIZE=all over each codelet program too. A
#    missing compute-sanitizer is a failure;
# 4. --deterministic on CUDA workers: two runs of the layer, their outputs
#    and gradients (--dump) the same bit for bit (no launcher adds with
#    atomics).
# One line per case; RESULTS_DIR (optional) gets gpu_checks.log and a CSV.
# GPU_CHECKS_DRY_RUN=1 runs the same cases on CPU workers instead (the
# script itself checked on a machine without a GPU; no sanitizer).
# GPU_CHECKS_BUDGET=S: every case ends within S seconds of the start (each
# case's time limit is cut to what is left); a case left without time is a
# failure, named as not run. Unset: each case has its own limit only.
set -uo pipefail
build=$1 mpiexec=$2 results=${3:-}
app=$build/apps/relaymoe raw=$build/tests/mpi/test_raw
codelets=(test_codelets test_codelets_router test_codelets_dispatch test_codelets_expert test_codelets_bf16)
dry=${GPU_CHECKS_DRY_RUN:-0}
budget=${GPU_CHECKS_BUDGET:-}
[ -z "$budget" ] || [[ $budget =~ ^[0-9]+$ ]] || { echo "gpu_checks: GPU_CHECKS_BUDGET='$budget': expected seconds" >&2; exit 2; }
export STARPU_SILENT=1 STARPU_WORKERS_NOBIND=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 passes=0
log() { echo "$*"; [ -n "$results" ] && echo "$*" >>"$results/gpu_checks.log"; return 0; }
ok() { passes=$((passes + 1)); log "ok: $*"; }
bad() { fails=$((fails + 1)); log "FAIL: $*"; }
[ -n "$results" ] && { mkdir -p "$results"; : >"$results/gpu_checks.log"; }

# limit CAP: the seconds a case may take, CAP cut to what the budget leaves
# (0: nothing left).
limit() {
  if [ -z "$budget" ]; then echo "$1"; return; fi
  local left=$((budget - SECONDS))
  [ $left -lt 0 ] && left=0
  echo $(($1 < left ? $1 : left))
}
# bounded CAP NAME CMD...: runs CMD within its limit into $out and $rc;
# returns 1 (after logging the failure) when no time is left to start it.
bounded() {
  local cap=$1 name=$2 t
  shift 2
  t=$(limit "$cap")
  if [ "$t" -le 0 ]; then
    bad "$name: not run, the budget of $budget s was spent"
    return 1
  fi
  out=$(timeout -k 5 "$t" "$@" 2>&1); rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && out+=$'\n'"(timed out after $t s)"
  return 0
}

# CUDA workers only: every dispatcher but a2a-deepep, whose index tasks have
# a CPU function only (the layer refuses it without a CPU worker); the run
# with CPU and CUDA workers checks all five.
gpu_disp=ring,token,a2a,a2a-megatron
small=(--hidden 64 --ffn 32 --experts 16 --topk 4 --tokens 256 --repeat 1 --quiet)
if [ "$dry" = 1 ]; then gpu=(STARPU_NCPU=1 STARPU_NCUDA=0) mixed=(STARPU_NCPU=2 STARPU_NCUDA=0) device='' wname=CPU
else gpu=(STARPU_NCPU=0 STARPU_NCUDA=1) mixed=(STARPU_NCPU=1 STARPU_NCUDA=1) device=cuda wname=CUDA; fi

# Is there a CUDA worker at all? StarPU's answer, through the program.
if bounded 120 "a run on $wname workers only" env "${gpu[@]}" "$app" run "${small[@]}" --dispatch ring; then
  if [ $rc -ne 0 ] && grep -q "found no worker" <<<"$out"; then
    log "gpu_checks: StarPU found no CUDA worker (a build without -DRMOE_CUDA=ON, or no GPU): skipped"
    exit 77
  fi
  [ $rc -eq 0 ] && ok "a run on $wname workers only" || { bad "a run on $wname workers only (rc=$rc)"; log "$out"; }
fi

# 1. Every codelet on the CUDA worker against its double loop.
for prog in "${codelets[@]}"; do
  bounded 60 "$prog on $wname" env RMOE_TEST_DEVICE=$device "$build/tests/unit/$prog" || continue
  n=$(grep -c "^\[       OK \]" <<<"$out")
  [ $rc -eq 0 ] && ok "$prog on $wname: $n tests passed" || { bad "$prog on $wname (rc=$rc)"; log "$out"; }
done

# The expert codelets in the other GEMM ways (the default, grouped, above).
for way in strided loop; do
  bounded 60 "test_codelets_expert on $wname, RMOE_CUDA_GEMM=$way" env RMOE_TEST_DEVICE=$device RMOE_CUDA_GEMM=$way \
    "$build/tests/unit/test_codelets_expert" || continue
  n=$(grep -c "^\[       OK \]" <<<"$out")
  [ $rc -eq 0 ] && ok "test_codelets_expert on $wname, GEMM way $way: $n tests passed" \
    || { bad "test_codelets_expert on $wname, GEMM way $way (rc=$rc)"; log "$out"; }
done

# 2. The layer end to end against the reference.
csv=$work/runs.csv
check_run() { # check_run NAME NP ENV... -- ARGS...
  local name=$1 np=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  bounded 90 "$name" env "${envs[@]}" "$mpiexec" -n "$np" --oversubscribe --bind-to none "$app" run \
    "${small[@]}" --check --csv "$csv" "$@" || return 0
  local checks pass
  checks=$(grep -c "vs reference" <<<"$out"); pass=$(grep -c "vs reference.*PASS" <<<"$out")
  if [ $rc -eq 0 ] && [ "$checks" -gt 0 ] && [ "$checks" -eq "$pass" ]; then
    ok "$name: $(grep "vs reference" <<<"$out" | sed -E 's/.*check ([a-z0-9-]+) vs reference: largest relative error ([^ ]+).*/\1 \2/' | paste -sd, -)"
  else bad "$name (rc=$rc, $pass of $checks checks passed)"; log "$out"; fi
}
for dt in f32 bf16; do
  check_run "1 rank, 4 partitions, $dt" 1 "${gpu[@]}" -- --dtype $dt --dispatch ring --partitions 4
  check_run "1 rank, ring/token/a2a/a2a-megatron, $dt" 1 "${gpu[@]}" -- --dtype $dt --dispatch $gpu_disp
  check_run "2 ranks sharing the GPU, $dt" 2 "${gpu[@]}" -- --dtype $dt --dispatch $gpu_disp
done
check_run "2 ranks, CPU and CUDA workers (dmdas), every dispatcher, bf16" 2 "${mixed[@]}" -- --dtype bf16 --dispatch all --sched dmdas
if [ "$dry" = 1 ]; then
  log "dry run: --io device and device buffers not run"
else
  for dt in f32 bf16; do
    check_run "activations on the device (--io device), $dt" 1 "${gpu[@]}" -- --dtype $dt --dispatch $gpu_disp --io device
  done
  if bounded 90 "_raw calls on device buffers" env "${gpu[@]}" "$mpiexec" -n 1 "$raw" device; then
    [ $rc -eq 0 ] && ok "_raw calls on device buffers = float32 calls, bit for bit (ring, token, a2a; f32, bf16)" \
      || { bad "_raw calls on device buffers (rc=$rc)"; log "$out"; }
  fi
fi
# The device's peak memory is reported for runs on CUDA workers.
if [ "$dry" = 1 ]; then log "dry run: no device memory to report"
elif [ -s "$csv" ] && python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
bad = [r for r in rows if float(r["peak_device_fwd_bytes"]) <= 0 or float(r["peak_device_bwd_bytes"]) <= 0]
sys.exit(1 if not rows or bad else 0)
PY
then ok "device peak memory reported by every run"; else bad "a run reported no device peak memory"; fi
[ -n "$results" ] && [ -s "$csv" ] && cp "$csv" "$results/gpu_checks.csv"

# 3. compute-sanitizer (memcheck): one layer on one rank (every launcher of
# a pass); the codelet programs where asked (GPU_CHECKS_SANITIZE=all).
sanitizer=$(command -v compute-sanitizer || { [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" ] &&
  echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer"; })
memcheck=(--tool memcheck --error-exitcode 9)
if [ "$dry" = 1 ]; then log "dry run: compute-sanitizer not run"
elif [ -z "$sanitizer" ]; then
  bad "compute-sanitizer not found (PATH, ${CUDA_HOME:-/usr/local/cuda}/bin): memcheck not run"
else
  if bounded 90 "compute-sanitizer memcheck: relaymoe run" env "${gpu[@]}" "$sanitizer" "${memcheck[@]}" \
       "$app" run "${small[@]}" --dtype bf16 --dispatch $gpu_disp --partitions 2 --check; then
    [ $rc -eq 0 ] && ok "compute-sanitizer memcheck: relaymoe run bf16, ring/token/a2a/a2a-megatron, 1 rank" \
      || { bad "compute-sanitizer memcheck: relaymoe run (rc=$rc)"; log "$(grep -m20 -E "=====|FAIL|timed out" <<<"$out")"; }
  fi
  for prog in "${codelets[@]}"; do
    [ "${GPU_CHECKS_SANITIZE:-}" = all ] || break
    bounded 60 "compute-sanitizer memcheck: $prog" env RMOE_TEST_DEVICE=$device "$sanitizer" "${memcheck[@]}" \
      "$build/tests/unit/$prog" || continue
    [ $rc -eq 0 ] && ok "compute-sanitizer memcheck: $prog on CUDA" \
      || { bad "compute-sanitizer memcheck: $prog (rc=$rc)"; log "$(grep -m20 -E "=====|FAIL|timed out" <<<"$out")"; }
  done
fi

# 4. Bit-reproducible on the device with --deterministic.
det_ok=1
for i in 1 2; do
  bounded 90 "deterministic run $i" env "${gpu[@]}" "$app" run "${small[@]}" --dtype bf16 --dispatch ring \
    --partitions 4 --deterministic --dump "$work/det$i" || { det_ok=0; break; }
  [ $rc -eq 0 ] || { bad "deterministic run $i (rc=$rc)"; log "$out"; det_ok=0; break; }
done
if [ $det_ok = 1 ]; then
  differ=() n=0
  for f in "$work"/det1/*.npy; do
    n=$((n + 1))
    cmp -s "$f" "$work/det2/${f##*/}" || differ+=("${f##*/}")
  done
  if [ $n -gt 0 ] && [ ${#differ[@]} -eq 0 ]; then ok "--deterministic on $wname workers: two runs' $n dumped arrays bit for bit"
  else bad "--deterministic on $wname workers: ${#differ[@]} of $n dumped arrays differ between two runs: ${differ[*]}"; fi
fi

log "gpu_checks: $passes passed, $fails failed"
[ $fails -eq 0 ]
