#!/usr/bin/env bash
# Every GPU case of the project in one call of at most 8 minutes, on a
# machine where nothing can be installed (the build comes from
# bench/gpu/pack.sh, made on a CPU machine). In order:
#   (a) the gpu label (tests/gpu/gpu_checks.sh): the CUDA codelets and the
#       layer on CUDA workers against the CPU reference, fp32 within 1e-5 and
#       bf16 within 1e-2, under compute-sanitizer for small cases;
#   (b) the card's cuBLAS bf16 GEMM rate (rmoe_gemm_rate): an 8192^3 GEMM,
#       and the GEMMs of one expert of the layer below;
#   (c) the Qwen3-30B-A3B layer (H=2048, F=768, E=128), bf16, forward and
#       backward with recomputation, one GPU, activations on the device:
#       T=16384 K=8, T=65536 K=8, T=65536 K=16; relaymoe's ring over 8
#       partitions, relaymoe's all-to-all, and the PyTorch peer
#       (bench/gpu/torch_moe.py: all-to-all style, EP=1, the block under one
#       checkpoint, grouped GEMM), each in its own process, interleaved in
#       rounds; time and peak device memory of each;
# then the table (bench/gpu/report.py), printed last.
#
#   bench/gpu/run.sh [--dry-run] [--build DIR] [--rounds N] [--budget S] RESULTS_DIR
#
# --build: a bundle of pack.sh or a CUDA build tree (default: .gpu, else
# build-cuda, in the repository). --dry-run: everything that runs without a
# GPU, on CPU workers at the smallest sizes (the layer's H, F, T divided by
# 16), the PyTorch peer on the CPU where PyTorch is installed: the script
# itself checked in CI, not a measurement. --rounds: interleaved rounds of
# (c) (2); --budget: seconds within which the last round must end, at the
# pace of the rounds before it (420).
# RESULTS_DIR receives run.log, gpu_checks.log, gpu_checks.csv,
# gemm_rate.csv, layer.csv, torch.jsonl and gpu.md.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dry=0 build= rounds=2 budget=420 results=
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1; shift ;;
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [ -z "$results" ] || { echo "run.sh: one results folder, not '$results' and '$1'" >&2; exit 2; }
       results=$1; shift ;;
  esac
done
[ -n "$results" ] || { echo "run.sh: RESULTS_DIR missing (see --help)" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --rounds '$rounds': expected a positive integer" >&2; exit 2; }
[[ $budget =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --budget '$budget': expected seconds" >&2; exit 2; }
if [ -z "$build" ]; then
  for b in "$root/.gpu" "$root/build-cuda"; do [ -x "$b/apps/relaymoe" ] && { build=$b; break; }; done
fi
[ -n "$build" ] && [ -x "$build/apps/relaymoe" ] || { echo "run.sh: no relaymoe build (--build DIR)" >&2; exit 2; }
build=$(cd "$build" && pwd)
mkdir -p "$results" || exit 2
results=$(cd "$results" && pwd)
rm -f "$results"/{run.log,gpu_checks.log,gpu_checks.csv,gemm_rate.csv,layer.csv,torch.jsonl,gpu.md}
# The bundle's libraries for relaymoe's programs only: its reference BLAS
# under OpenBLAS's name would break NumPy and PyTorch.
# CUDA's own folder too, in case the machine's loader does not list it.
libdirs=${LD_LIBRARY_PATH:-}
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" "$build/lib"; do [ -d "$d" ] && libdirs=$d${libdirs:+:$libdirs}; done
lib=(LD_LIBRARY_PATH="$libdirs")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export STARPU_SILENT=1 STARPU_WORKERS_NOBIND=1 STARPU_FXT_TRACE=0 PYTHONUNBUFFERED=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
app=$build/apps/relaymoe
py=$(command -v python3)
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import numpy" 2>/dev/null && [ $dry = 1 ] && py=/usr/bin/python3
start=$SECONDS
log() { echo "$*" | tee -a "$results/run.log"; }
elapsed() { echo $((SECONDS - start)); }

log "bench/gpu/run.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) dry=$dry build=$build commit=$(cat "$build/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null)"
if [ $dry = 1 ]; then
  gpu_env=(STARPU_NCPU=2 STARPU_NCUDA=0) io=host torch_dev=cpu
  H=128 F=48 E=128 cases="256:8 1024:8 1024:16" parts=8 repeat=2
else
  gpu_env=(STARPU_NCPU=0 STARPU_NCUDA=1) io=device torch_dev=cuda
  H=2048 F=768 E=128 cases="16384:8 65536:8 65536:16" parts=8 repeat=5
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$results/run.log"
fi

# (a) the gpu label
log "== (a) gpu checks ($(elapsed) s)"
env "${lib[@]}" GPU_CHECKS_DRY_RUN=$dry timeout 240 "$root/tests/gpu/gpu_checks.sh" "$build" mpirun "$results" >/dev/null 2>&1
checks_rc=$?
tail -1 "$results/gpu_checks.log" 2>/dev/null | tee -a "$results/run.log"
case $checks_rc in 0) checks=passed ;; 77) checks=skipped ;; 124) checks="timed out" ;; *) checks=FAILED ;; esac
log "gpu checks: $checks"

# (b) the cuBLAS rate: the expert mix at the largest case's rows per expert
log "== (b) cuBLAS bf16 GEMM rate ($(elapsed) s)"
rows=$((65536 * 8 / 128))
env "${lib[@]}" timeout 120 "$build/bench/gpu/rmoe_gemm_rate" --rows $rows --csv "$results/gemm_rate.csv" 2>&1 | tee -a "$results/run.log"
[ ${PIPESTATUS[0]} -eq 77 ] && log "gemm rate: no CUDA device (dry run)"

# The peer is the same layer: its GPU path (grouped GEMM, bf16) against a
# relaymoe dump of a small problem.
log "== the PyTorch peer against relaymoe ($(elapsed) s)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
env "${lib[@]}" "${gpu_env[@]}" timeout 120 mpirun -np 1 --bind-to none "$app" run --hidden 128 --ffn 64 --experts 16 --topk 4 \
  --tokens 512 --dtype bf16 --dispatch ring --repeat 1 --quiet --dump "$tmp/dump" >>"$results/run.log" 2>&1
timeout 180 "$py" "$here/torch_moe.py" check "$tmp/dump" --topk 4 --device $torch_dev --dtype bf16 --tol 2e-2 \
  2>&1 | tail -1 | tee -a "$results/run.log"
peer_rc=${PIPESTATUS[0]}
case $peer_rc in 0) peer=passed ;; 77) peer="skipped (no PyTorch)" ;; *) peer=FAILED ;; esac

# (c) the layer, interleaved: ring, a2a, torch per case, round after round
log "== (c) the Qwen3-30B-A3B layer, bf16 ($(elapsed) s)"
relay() { # relay ROUND T K DISPATCH...
  local round=$1 t=$2 k=$3; shift 3
  local before t0=$SECONDS
  before=$(wc -l <"$results/layer.csv" 2>/dev/null || echo 0)
  env "${lib[@]}" "${gpu_env[@]}" timeout 240 mpirun -np 1 --bind-to none "$app" run --hidden $H --ffn $F --experts $E \
    --topk $k --tokens $t --dtype bf16 --io $io --sched prio --repeat $repeat --quiet --csv "$results/layer.csv" \
    "$@" >>"$results/run.log" 2>&1
  local rc=$?
  local after
  after=$(wc -l <"$results/layer.csv" 2>/dev/null || echo 0)
  log "  round $round T=$t K=$k relaymoe $*: rc=$rc, $((SECONDS - t0)) s$([ "$after" -gt "$before" ] || echo ', no result')"
}
peer_bench() { # peer_bench ROUND T K
  local t0=$SECONDS
  timeout 240 "$py" "$here/torch_moe.py" bench --hidden $H --ffn $F --experts $E --topk $3 --tokens $2 \
    --device $torch_dev --dtype bf16 --repeat $repeat --warmup 2 >"$tmp/torch.json" 2>>"$results/run.log"
  local rc=$?
  [ $rc -eq 0 ] && sed "s/^{/{\"round\": $1, /" "$tmp/torch.json" >>"$results/torch.jsonl"
  log "  round $1 T=$2 K=$3 torch: rc=$rc, $((SECONDS - t0)) s"
}
c_start=$(elapsed)
for round in $(seq 1 "$rounds"); do
  # Another round only when it ends within the budget, at the pace so far.
  if [ $round -gt 1 ]; then
    per_round=$(( ($(elapsed) - c_start) / (round - 1) ))
    if [ $(( $(elapsed) + per_round )) -gt "$budget" ]; then
      log "round $round not started: $(elapsed) s spent, a round takes ~$per_round s, budget $budget s"; break
    fi
  fi
  for c in $cases; do
    t=${c%:*} k=${c#*:}
    relay $round $t $k --dispatch ring --partitions $parts
    relay $round $t $k --dispatch a2a
    peer_bench $round $t $k
  done
done

log "bench/gpu/run.sh: measurements done in $(elapsed) s; the table (also in $results/gpu.md):"
"$py" "$here/report.py" "$results" --checks "$checks" --peer "$peer" --dry-run $dry
rc=$?
[ $rc -eq 0 ] && [ "$checks" != FAILED ] && [ "$peer" != FAILED ]
