#!/usr/bin/env bash
# The layer's FLOP rate against the machine's GEMM rate (issue 16, items 1
# and 2): how much of OpenBLAS's sgemm rate `relaymoe run` keeps on the same
# cores, at compute-bound shapes, and where the rest goes.
#
#   bench/rate/run.sh [--quick] [--rounds N] [--repeat R] [--shapes LIST]
#                     [--configs LIST] [--breakdown LIST] [--build DIR]
#                     [--trace-build DIR] [--out DIR] [--no-torch]
#
# Per shape, round after round (the order rotating from round to round, so
# that none always runs first on a shared machine):
#   relaymoe  `relaymoe run --dispatch ring --repeat R` once per
#             configuration; its forward and backward medians
#   sgemm     bench/rate/sgemm_rate.c: OpenBLAS on the layer's own GEMM list
#             (router and every expert's GEMMs at the rows the routing gave,
#             as the kernels call them), forward and backward: t2s1 one
#             stream, 2 OpenBLAS threads; t1s2 two streams of one-threaded
#             calls started together (2 ranks: each rank's list); t2s1f as
#             t2s1 with gate and up as one [H x 2F] GEMM; t2s1d as t2s1
#             with OpenBLAS's own kernel choice, where relaymoe corrects it
#             (OPENBLAS_CORETYPE, scripts/lib/blas-env.sh)
#   torch     bench/gpu/torch_moe.py bench on the CPU with as many threads
#             as cores: forward+backward (recomputing) of the same layer
# Before the rounds, one run per shape and breakdown configuration with
# StarPU's history models recorded in a fresh STARPU_HOME per rank
# (STARPU_CALIBRATE=1) and its worker statistics (STARPU_PROFILING=1,
# STARPU_WORKER_STATS=1), and one-thread sgemm (t1s1): where a pass's time
# goes (bench/rate/breakdown.py). Those runs also write each shape's
# routing (`relaymoe run --routing`), from which the flops are counted and
# the sgemm lists built. --trace-build DIR: a relaymoe build against a
# StarPU with FxT (scripts/build-starpu.sh --fxt); each breakdown run is
# repeated with it under --trace, and bench/rate/trace_gaps.py says how much
# of each pass lies outside its tasks (rate_trace.csv).
#
# SHAPE: NAME:H:F:E:K:T, T the tokens of all ranks together (split evenly).
# Default: issue16:1024:512:8:2:4096 (the issue's), and Qwen3-30B-A3B's
# H=2048, F=768 with 16 experts: qwen3-k8:2048:768:16:8:256 and
# qwen3-k2:2048:768:16:2:1024 (128 rows per expert on one rank).
# CONFIG: rN-wXbY-POLICY[-nocache][-nosampler]: N ranks, STARPU_NCPU=X workers
# per rank, OPENBLAS_NUM_THREADS=Y, StarPU policy POLICY; -nocache:
# RMOE_HOST_CACHE=off; -nosampler: RMOE_HEAP_SAMPLER_US=off
# (StarPU's host buffers not cached: docs/tuning.md). The library keeps
# OPENBLAS_NUM_THREADS when set; Y > 1 also preloads bench/rate/blas_threads.c,
# which keeps builds that set OpenBLAS to one thread (before
# rmoe_ctx_config.blas_threads) from doing so. r1-w1b2 and r2-w1b1 are the
# library's defaults on 2 cores. Default: r1-w2b1-lws r1-w1b2-lws
# r1-w1b2-lws-nocache r1-w2b1-eager r1-w2b1-dmdas r2-w1b1-lws; --breakdown default: r1-w2b1-lws r1-w1b2-lws
# r2-w1b1-lws ('' for none).
# --rounds (3), --repeat: relaymoe's and torch's timed steps per run (3).
# --quick: one small shape (quick:256:128:8:2:1024), r1-w2b1-lws and
# r2-w1b1-lws, one round of one step, into BUILD/bench-rate-quick: checks the
# script and the counts, not a measurement (CTest bench_rate_quick).
# Writes rate.csv (every measurement), rate_breakdown.csv, rate_routing.csv,
# (rate_trace.csv,) rate.png and rate.md into --out (default bench/results), all at the end:
# nothing is written when a step fails. Exit status 0, 1 when a step
# failed or a check of report.py did not hold, 2 on bad options.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cmdline="bench/rate/run.sh${*:+ $*}"
die() { echo "rate/run.sh: $*" >&2; exit 2; }
quick=0 no_torch=0 rounds='' repeat='' shapes='' configs='' breakdown=unset build=$root/build out='' torch=1 trace_build=
# shellcheck source=scripts/lib/opts.sh
. "$root/scripts/lib/opts.sh"
OPT_VALUE+=([--rounds]=rounds [--repeat]=repeat [--shapes]=shapes [--configs]=configs [--breakdown]=breakdown
  [--build]=build [--trace-build]=trace_build [--out]=out)
OPT_FLAG+=([--quick]=quick [--no-torch]=no_torch)
opts_parse "$@"
[ "$no_torch" = 1 ] && torch=0
if [ $quick = 1 ]; then
  rounds=${rounds:-1} repeat=${repeat:-1} shapes=${shapes:-quick:256:128:8:2:1024}
  configs=${configs:-r1-w2b1-lws r2-w1b1-lws}
  [ "$breakdown" = unset ] && breakdown="r1-w2b1-lws"
  out=${out:-$build/bench-rate-quick}
else
  rounds=${rounds:-3} repeat=${repeat:-3}
  shapes=${shapes:-issue16:1024:512:8:2:4096 qwen3-k8:2048:768:16:8:256 qwen3-k2:2048:768:16:2:1024}
  configs=${configs:-r1-w2b1-lws r1-w1b2-lws r1-w1b2-lws-nocache r1-w2b1-eager r1-w2b1-dmdas r2-w1b1-lws}
  [ "$breakdown" = unset ] && breakdown="r1-w2b1-lws r1-w1b2-lws r2-w1b1-lws"
  out=${out:-$root/bench/results}
fi
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds '$rounds': expected a positive integer"
[[ $repeat =~ ^[1-9][0-9]*$ ]] || die "--repeat '$repeat': expected a positive integer"
for s in $shapes; do
  [[ $s =~ ^[A-Za-z0-9_.-]+(:[1-9][0-9]*){5}$ ]] || die "--shapes: '$s' is not NAME:H:F:E:K:T"
done
for c in $configs $breakdown; do
  [[ $c =~ ^r[1-9][0-9]*-w[1-9][0-9]*b[1-9][0-9]*-[a-z_-]+$ ]] || die "'$c' is not a configuration rN-wXbY-POLICY[-nocache][-nosampler]"
done
[ -n "$configs" ] || die "--configs: give at least one configuration"
build=$(cd "$build" 2>/dev/null && pwd) || die "no build tree at '$build'"
app=$build/apps/relaymoe
[ -x "$app" ] || die "$app missing: build first (scripts/build.sh, or --build DIR)"
if [ -n "$trace_build" ]; then
  trace_build=$(cd "$trace_build" 2>/dev/null && pwd) || die "--trace-build: no build tree at '$trace_build'"
  [ -x "$trace_build/apps/relaymoe" ] || die "--trace-build: $trace_build/apps/relaymoe missing"
  [ -n "$breakdown" ] || die "--trace-build traces the breakdown configurations: --breakdown is empty"
fi
py=/usr/bin/python3
[ -x $py ] || py=$(command -v python3)
"$py" -c 'import numpy, matplotlib' 2>/dev/null || die "$py needs numpy and matplotlib (scripts/setup.sh)"
if [ $torch = 1 ] && ! "$py" -c 'import torch' 2>/dev/null; then
  echo "rate/run.sh: PyTorch missing: no torch peer (RMOE_SETUP_EXTRA=python3-torch scripts/setup.sh installs it)"
  torch=0
fi
cores=$(nproc)
# Every shape's tokens split evenly over every rank count used.
rank_counts=$(for c in $configs $breakdown; do c=${c#r}; echo "${c%%-*}"; done | sort -un)
for s in $shapes; do
  IFS=: read -r name H F E K T <<<"$s"
  for n in $rank_counts; do
    if [ $((T % n)) != 0 ] || [ $((E % n)) != 0 ]; then
      die "shape $name: $n ranks need T=$T and E=$E multiples of $n"
    fi
  done
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export STARPU_SILENT=1 STARPU_WORKERS_NOBIND=1 STARPU_FXT_TRACE=0 PYTHONUNBUFFERED=1
unset STARPU_NCPU STARPU_SCHED STARPU_CALIBRATE STARPU_PROFILING STARPU_WORKER_STATS OPENBLAS_NUM_THREADS
# The sgemm baseline runs the kernels relaymoe runs (scripts/lib/blas-env.sh).
# shellcheck source=scripts/lib/blas-env.sh
. "$root/scripts/lib/blas-env.sh"
rmoe_blas_env "$build"
log=$tmp/run.log
say() { echo "$*" | tee -a "$log"; }
load1() { cut -d' ' -f1 /proc/loadavg; }
start=$SECONDS

# The programs: the sgemm list and the preloaded BLAS-threads shim.
blas=$(pkg-config --cflags --libs openblas) || die "pkg-config finds no openblas"
# shellcheck disable=SC2086
gcc -O2 -std=gnu11 -Wall -Wextra "$here/sgemm_rate.c" -o "$tmp/sgemm_rate" $blas -lpthread -lm
gcc -O2 -std=gnu11 -Wall -Wextra -shared -fPIC "$here/blas_threads.c" -o "$tmp/libblas_threads.so"
# OpenBLAS's own kernel choice where relaymoe corrects it: sgemm runs it too
# (mode t2s1d), to show what the correction is worth.
own_core=$(env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2 "$tmp/sgemm_rate" --header 2>&1 | sed -n 's/^Core: //p' | head -1)
if [ -z "${OPENBLAS_CORETYPE:-}" ] || [ "${own_core,,}" = "${OPENBLAS_CORETYPE,,}" ]; then own_core=; fi

{
  echo "command=$cmdline"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nproc=$cores"
  echo "cpu=$(lscpu 2>/dev/null | awk -F': *' '/^Model name/ { m = $2 } /^CPU family/ { f = $2 } /^Model:/ { n = $2 }
    /^Flags/ { a = $2 ~ /avx512f/ ? ", AVX-512" : ($2 ~ /avx2/ ? ", AVX2" : "") }
    END { print m " (family " f ", model " n a ")" }')"
  echo "load_start=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo +)"
  echo "openblas=$(pkg-config --modversion openblas 2>/dev/null), $("$app" --blas-core) kernels"
  echo "openblas_own_core=$own_core"
  echo "starpu=$(pkg-config --modversion starpu-1.3 2>/dev/null)"
  echo "mpi=$(mpirun --version 2>/dev/null | head -1)"
  echo "torch=$([ $torch = 1 ] && "$py" -c 'import torch; print(torch.__version__)')"
  echo "rounds=$rounds"
  echo "repeat=$repeat"
  echo "quick=$quick"
} >"$tmp/meta.txt"
say "rate/run.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

# The flop count against an independent one, on a known uneven routing
# (an expert without rows among them): report.py compares.
printf 'rank,expert,rows\n0,0,5\n0,1,0\n0,2,11\n1,0,7\n1,1,9\n1,2,0\n' >"$tmp/known_routing.csv"
for p in fwd bwd; do
  "$tmp/sgemm_rate" --hidden 64 --ffn 32 --experts 3 --tokens 8 --topk 2 --routing "$tmp/known_routing.csv" \
    --pass $p --streams 2 --reps 1 --min-time 0 >>"$tmp/known_flops.csv"
done

# A config's parts: ranks, workers, BLAS threads, policy; a -nocache suffix
# turns the host buffer cache off (RMOE_HOST_CACHE=off), a -nosampler one
# the heap probe's sampler thread (RMOE_HEAP_SAMPLER_US=off).
parse_config() {  # parse_config CONFIG -> np ncpu nblas sched hcache hsampler
  local c=${1#r}
  hcache=auto hsampler=
  case $c in *-nosampler) hsampler=off c=${c%-nosampler} ;; esac
  case $c in *-nocache) hcache=off c=${c%-nocache} ;; esac
  np=${c%%-*}; c=${c#*-w}
  ncpu=${c%%b*}; c=${c#*b}
  nblas=${c%%-*}; sched=${c#*-}
}

# One relaymoe run: its CSV row into $2; a fresh STARPU_HOME per rank under
# $3 when given (the breakdown: calibrated models, worker statistics).
relaymoe_run() {  # relaymoe_run SHAPE CSV [HOMES] -- CONFIG RUN-ARGS... (RUN_APP: another build's)
  local shape=$1 csv=$2 homes=${3:-} exe=${RUN_APP:-$app} home=${RUN_HOME:-$tmp/starpu-home}; shift 4
  local config=$1; shift
  IFS=: read -r name H F E K T <<<"$shape"
  parse_config "$config"
  local env=(STARPU_NCPU="$ncpu" OPENBLAS_NUM_THREADS="$nblas" RMOE_HOST_CACHE="$hcache"
             RMOE_HEAP_SAMPLER_US="$hsampler")
  # as scripts/mpirun.sh: MPI yields when idle (bench/results/hop.md)
  local mpi=(mpirun --bind-to none --mca mpi_yield_when_idle 1 -np "$np")
  [ "$nblas" -gt 1 ] && mpi+=(-x LD_PRELOAD="$tmp/libblas_threads.so")
  local wrap=()
  if [ -n "$homes" ]; then
    env+=(STARPU_CALIBRATE=1 STARPU_HISTORY_MAX_ERROR=100000 STARPU_PROFILING=1 STARPU_WORKER_STATS=1
          STARPU_HOSTNAME=rate)
    # shellcheck disable=SC2016
    # each rank's output apart: its worker statistics at shutdown
    wrap=(sh -c 'export STARPU_HOME="$0/r${OMPI_COMM_WORLD_RANK:-0}"; mkdir -p "$STARPU_HOME"
                 exec "$@" >"$STARPU_HOME/out.log" 2>&1' "$homes")
  else
    env+=(STARPU_HOME="$home")
  fi
  env "${env[@]}" timeout 900 "${mpi[@]}" "${wrap[@]}" "$exe" run --hidden "$H" --ffn "$F" --experts "$E" \
    --topk "$K" --tokens $((T / np)) --dispatch ring --sched "$sched" --csv "$csv" "$@"
}

# StarPU measures the buses on its first start in a STARPU_HOME; ranks that
# start together would race on those files: one rank first.
STARPU_HOME=$tmp/starpu-home STARPU_NCPU=1 mpirun --bind-to none -np 1 "$app" run --hidden 8 --ffn 8 --experts 2 \
  --topk 1 --tokens 8 --dispatch ring --repeat 1 --quiet >>"$log" 2>&1 || { say "the first StarPU start failed"; exit 1; }

# ---- the breakdown runs, and the routing of every shape and rank count ----
echo "shape,ranks,rank,expert,rows" >"$tmp/rate_routing.csv"
: >"$tmp/breakdown_runs.txt"
routing() {  # routing SHAPE NP FILE: append FILE's rows
  tail -n +2 "$3" | sed "s/^/${1%%:*},$2,/" >>"$tmp/rate_routing.csv"
}
for s in $shapes; do
  name=${s%%:*}
  for n in $rank_counts; do
    got=0
    for c in $breakdown; do
      parse_config "$c"
      [ "$np" = "$n" ] || continue
      d=$tmp/breakdown/$name/$c
      mkdir -p "$d"
      say "breakdown $name $c ($((SECONDS - start)) s)"
      relaymoe_run "$s" "$d/run.csv" "$d/homes" -- "$c" --repeat "$repeat" --routing "$d/routing.csv" \
        >"$d/run.log" 2>&1 || { say "relaymoe failed: $d/run.log"; tail -5 "$d/run.log"; exit 1; }
      echo "$name $c $d" >>"$tmp/breakdown_runs.txt"
      [ $got = 1 ] || routing "$s" "$n" "$d/routing.csv"
      got=1
    done
    if [ $got = 0 ]; then
      say "routing $name $n rank(s) ($((SECONDS - start)) s)"
      relaymoe_run "$s" "$tmp/routing-run.csv" "" -- "r$n-w1b1-lws" --repeat 1 --quiet \
        --routing "$tmp/routing-$name-$n.csv" >>"$log" 2>&1 || { say "relaymoe failed (see the log)"; exit 1; }
      routing "$s" "$n" "$tmp/routing-$name-$n.csv"
    fi
  done
done
# The sgemm list of a shape at a rank count: its routing as sgemm_rate reads it.
routing_file() {  # routing_file NAME NP
  local f=$tmp/routing-$1-$2.csv
  [ -s "$f" ] || { echo "rank,expert,rows"; awk -F, -v s="$1" -v n="$2" '$1 == s && $2 == n { print $3 "," $4 "," $5 }' \
    "$tmp/rate_routing.csv"; } >"$f"
  echo "$f"
}
# One-thread sgemm on the lists of one rank: the rate of one worker's GEMMs.
echo "shape,ranks,$("$tmp/sgemm_rate" --header)" >"$tmp/sgemm_t1s1.csv"
if [ -n "$breakdown" ]; then
  for s in $shapes; do
    IFS=: read -r name H F E K T <<<"$s"
    for n in $rank_counts; do
      for p in fwd bwd; do
        "$tmp/sgemm_rate" --hidden "$H" --ffn "$F" --experts "$E" --tokens $((T / n)) --topk "$K" \
          --routing "$(routing_file "$name" "$n")" --pass $p --threads 1 | sed "s/^/$name,$n,/" >>"$tmp/sgemm_t1s1.csv"
      done
    done
  done
fi

# The breakdown configurations again under FxT.
if [ -n "$trace_build" ]; then
  mkdir -p "$tmp/starpu-home-fxt"
  STARPU_HOME=$tmp/starpu-home-fxt STARPU_NCPU=1 mpirun --bind-to none -np 1 "$trace_build/apps/relaymoe" run \
    --hidden 8 --ffn 8 --experts 2 --topk 1 --tokens 8 --dispatch ring --repeat 1 --quiet >>"$log" 2>&1 ||
    { say "the traced build's first StarPU start failed"; exit 1; }
  tdirs=() tlabels='' tcsvs=''
  for s in $shapes; do
    name=${s%%:*}
    for c in $breakdown; do
      d=$tmp/trace/$name/$c
      mkdir -p "$tmp/trace/$name"
      say "trace $name $c ($((SECONDS - start)) s)"
      RUN_APP=$trace_build/apps/relaymoe RUN_HOME=$tmp/starpu-home-fxt relaymoe_run "$s" "$d.csv" "" -- "$c" \
        --repeat "$repeat" --quiet --trace "$d" >>"$log" 2>&1 || { say "traced relaymoe failed (see the log)"; exit 1; }
      tdirs+=("$d") tlabels+=${tlabels:+,}$name/$c tcsvs+=${tcsvs:+,}$d.csv
    done
  done
  "$py" "$here/trace_gaps.py" "${tdirs[@]}" --labels "$tlabels" --csv "$tcsvs" --repeat "$repeat" \
    --out "$tmp/rate_trace.csv" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || { say "trace_gaps.py failed"; exit 1; }
  echo "trace_starpu=$(sed -n 's/^RMOE_STARPU_PREFIX:PATH=//p' "$trace_build/CMakeCache.txt")" >>"$tmp/meta.txt"
fi

# ---- the rounds ----
echo "round,order,shape,hidden,ffn,experts,topk,tokens,ranks,impl,config,pass,ms,ms_min,ms_max,flops,load1" \
  >"$tmp/raw.csv"
row() {  # row ROUND ORDER SHAPE RANKS IMPL CONFIG PASS MS MS_MIN MS_MAX FLOPS LOAD
  local IFS=:
  read -r name H F E K T <<<"$3"
  echo "$1,$2,$name,$H,$F,$E,$K,$T,$4,$5,$6,$7,$8,$9,${10},${11},${12}" >>"$tmp/raw.csv"
}
item() {  # item ROUND ORDER SHAPE KIND ARG
  local round=$1 order=$2 shape=$3 kind=$4 arg=$5 l t0=$SECONDS
  IFS=: read -r name H F E K T <<<"$shape"
  l=$(load1)
  case $kind in
    relaymoe)
      parse_config "$arg"
      rm -f "$tmp/one.csv"
      relaymoe_run "$shape" "$tmp/one.csv" "" -- "$arg" --repeat "$repeat" --quiet >>"$log" 2>&1 ||
        { say "relaymoe $name $arg failed (round $round)"; tail -5 "$log"; exit 1; }
      # fwd_ms, bwd_ms: columns 9 and 10; the forward+backward range: 29,
      # 30; what ran: the policy (24) and workers (25)
      IFS=, read -r -a f < <(tail -1 "$tmp/one.csv")
      if [ "${f[23]}" != "$sched" ] || [ "${f[24]}" != "$ncpu" ]; then
        say "relaymoe $name $arg ran policy ${f[23]} with ${f[24]} worker(s)"; exit 1
      fi
      row "$round" "$order" "$shape" "$np" relaymoe "$arg" fwd "${f[8]}" "" "" "" "$l"
      row "$round" "$order" "$shape" "$np" relaymoe "$arg" bwd "${f[9]}" "" "" "" "$l"
      row "$round" "$order" "$shape" "$np" relaymoe "$arg" step "$(awk "BEGIN { print ${f[8]} + ${f[9]} }")" \
        "${f[28]}" "${f[29]}" "" "$l" ;;
    torch)
      timeout 900 "$py" "$root/bench/gpu/torch_moe.py" bench --hidden "$H" --ffn "$F" --experts "$E" --topk "$K" \
        --tokens "$T" --device cpu --threads "$cores" --repeat "$repeat" --warmup 1 >"$tmp/torch.json" 2>>"$log" ||
        { say "torch $name failed (round $round)"; exit 1; }
      read -r ms lo hi < <("$py" -c 'import json, sys; d = json.load(open(sys.argv[1]))
print(d["median_ms"], min(d["times_ms"]), max(d["times_ms"]))' "$tmp/torch.json")
      row "$round" "$order" "$shape" 1 torch "cpu-t$cores" step "$ms" "$lo" "$hi" "" "$l" ;;
    sgemm)  # ARG: NP:MODE, MODE t2s1 | t1s2 | t2s1f
      local n=${arg%%:*} mode=${arg#*:} opts=() p
      case $mode in
        t2s1) opts=(--threads 2) ;;
        t1s2) opts=(--streams 2) ;;
        t2s1f) opts=(--threads 2 --fused) ;;
        t2s1d) opts=(--threads 2) ;;
      esac
      local run=("$tmp/sgemm_rate")
      [ "$mode" = t2s1d ] && run=(env -u OPENBLAS_CORETYPE "$tmp/sgemm_rate")
      for p in fwd bwd; do
        IFS=, read -r -a g < <("${run[@]}" --hidden "$H" --ffn "$F" --experts "$E" --tokens $((T / n)) \
          --topk "$K" --routing "$(routing_file "$name" "$n")" --pass $p "${opts[@]}")
        row "$round" "$order" "$shape" "$n" sgemm "$mode" $p "$(awk "BEGIN { print ${g[6]} * 1e3 }")" \
          "$(awk "BEGIN { print ${g[7]} * 1e3 }")" "$(awk "BEGIN { print ${g[8]} * 1e3 }")" "${g[5]}" "$l"
      done ;;
  esac
  say "  round $round #$order $name $kind $arg: $((SECONDS - t0)) s"
}
for round in $(seq 1 "$rounds"); do
  say "== round $round/$rounds ($((SECONDS - start)) s, load $(load1))"
  for s in $shapes; do
    items=()
    for c in $configs; do items+=("relaymoe $c"); done
    [ $torch = 1 ] && items+=("torch -")
    for n in $rank_counts; do
      if [ "$n" = 1 ]; then
        items+=("sgemm 1:t2s1" "sgemm 1:t1s2" "sgemm 1:t2s1f")
        [ -n "$own_core" ] && items+=("sgemm 1:t2s1d")
      else items+=("sgemm $n:t1s2"); fi
    done
    # rotate by a fraction of the list each round: no item always first
    k=${#items[@]} step=$(( (${#items[@]} + rounds - 1) / rounds ))
    for i in $(seq 0 $((k - 1))); do
      it=${items[$(( (i + (round - 1) * step) % k ))]}
      item "$round" $((i + 1)) "$s" "${it% *}" "${it#* }"
    done
  done
done
echo "load_end=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$tmp/meta.txt"
echo "seconds=$((SECONDS - start))" >>"$tmp/meta.txt"

# ---- the breakdown and the report ----
"$py" "$here/breakdown.py" --runs "$tmp/breakdown_runs.txt" --sgemm "$tmp/sgemm_t1s1.csv" \
  --routing "$tmp/rate_routing.csv" --shapes "$shapes" --repeat "$repeat" --out "$tmp/rate_breakdown.csv" \
  2>&1 | tee -a "$log"
[ "${PIPESTATUS[0]}" = 0 ] || { say "breakdown.py failed"; exit 1; }
mkdir -p "$tmp/out"
rc=0
"$py" "$here/report.py" --raw "$tmp/raw.csv" --routing "$tmp/rate_routing.csv" --breakdown "$tmp/rate_breakdown.csv" \
  --known "$tmp/known_flops.csv" --meta "$tmp/meta.txt" --shapes "$shapes" --out "$tmp/out" \
  ${trace_build:+--trace "$tmp/rate_trace.csv"} || rc=$?
[ $rc = 0 ] || { say "report.py: a check failed or the report could not be written (exit $rc)"; exit 1; }
cp "$tmp/rate_routing.csv" "$tmp/rate_breakdown.csv" "$tmp/out/"
[ -z "$trace_build" ] || cp "$tmp/rate_trace.csv" "$tmp/out/"
mkdir -p "$out"
[ -n "$trace_build" ] || rm -f "$out/rate_trace.csv"   # not this run's
for f in "$tmp"/out/*; do mv -f "$f" "$out/"; done
say "rate/run.sh: done in $((SECONDS - start)) s: $out/rate.md"
