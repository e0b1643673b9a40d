#!/usr/bin/env bash
# Every GPU case of the project in one call that ends by itself within
# --budget seconds (450: under 8 minutes with the kills' grace), on a machine
# where nothing can be installed (the build comes from bench/gpu/pack.sh,
# made on a CPU machine). In order, each step within a time budget of its own:
#   preflight (at most 30 s; not in a dry run): nvidia-smi and a GPU, mpirun,
#       compute-sanitizer, PyTorch with CUDA, the libraries of every carried
#       program through ldd (CUDA 13's runtime and cuBLAS, Open MPI, hwloc,
#       StarPU; PyTorch's nvidia/*/lib folders join the library path for
#       what /usr/local/cuda/lib64 lacks), and a CUDA worker found by
#       StarPU (a small relaymoe run on CUDA workers only). It prints what it
#       found; anything missing is named and the script stops there (exit 3);
#   (a) the gpu label (tests/gpu/gpu_checks.sh): the CUDA codelets (the
#       expert ones in every GEMM way) and the layer on CUDA workers against
#       the CPU reference, fp32 within 1e-5 and bf16 within 1e-2, one layer
#       run under compute-sanitizer, two --deterministic runs bit for bit
#       (120 s);
#   (b) the card's cuBLAS bf16 GEMM rate (rmoe_gemm_rate): an 8192^3 GEMM,
#       the GEMMs of one expert of the layer below a call each, the same
#       GEMMs over one of the ring's partitions in each way of the expert
#       launchers (grouped, strided, loop: one call per matrix), one hop's
#       expert tasks in each way, and the device's copy bandwidth (40 s);
#       the fastest way is the one every relaymoe run below gets
#       (RMOE_CUDA_GEMM; unset, the launchers' default, grouped);
#   (t) one ring run at the first case traced (relaymoe run --trace, 2
#       steps after a warm-up): its tasks.rec, of which report.py breaks
#       the last step down by task kind (in-task time, the GEMM kinds' rate
#       against cuBLAS's, the row kinds' bandwidth against the copy's, the
#       idle gaps) (60 s);
#   (p) the PyTorch peer and a relaymoe dump of a small bf16 problem, both
#       against the layer in float64 (torch_moe.py check: relaymoe within
#       2e-2, the peer's bf16 path within 2e-2, 5e-2 on the CPU), with one
#       expert group and with the ring's grouping (60 s);
#   (c) the Qwen3-30B-A3B layer (H=2048, F=768, E=128), bf16, forward and
#       backward with recomputation, one GPU, activations on the device, at
#       T=65536 K=8 (first: the acceptance case), T=16384 K=8, T=65536 K=16;
#       per case, each in its own process:
#         ring         relaymoe's ring over 8 partitions of the experts (8
#                      hops on the one GPU, one partition's rows alive)
#         a2a          relaymoe's all-to-all at EP=1 (nothing is sent): all
#                      T*K rows at once, one group of all experts
#         torch        the PyTorch peer, all-to-all style, one group, the
#                      block under one checkpoint (bench/gpu/torch_moe.py):
#                      what a user would run instead
#         torch-part   the PyTorch peer with the ring's grouping: 8 groups
#                      of experts in turn, each under its own checkpoint
#         ring-live, a2a-live   ring and a2a again, one pass, with StarPU's
#                      cache of freed device buffers off (RMOE_DEVICE_CACHE=
#                      off, codelets/probe/probe.c): the bytes the layer's data
#                      held, against PyTorch's max_memory_allocated
#       ring against torch-part and a2a against torch compare at equal
#       grouping; ring against torch is the acceptance ratio. Round 1 runs
#       every process; later rounds (--rounds) rerun the timed ones while
#       their round-1 pace fits the budget. The rest of the budget less 10 s;
#   then the table (bench/gpu/report.py, from whatever exists, the missing
#   cases marked), printed last; it is also rewritten after each case.
#
#   bench/gpu/run.sh [--dry-run] [--build DIR] [--rounds N] [--budget S]
#                    [--only STEPS] [--cases T:K,...] RESULTS_DIR
#
# --build: a bundle of pack.sh or a CUDA build tree (default: build-gpu,
# .gpu, else build-cuda, in the repository). --dry-run: everything that
# runs without a GPU, on CPU workers at the smallest sizes (the layer's H,
# F, T divided by 16), the PyTorch peer on the CPU where PyTorch is
# installed: the script itself checked in CI, not a measurement; no
# preflight. --rounds: rounds of (c) (2). --budget: seconds the whole run
# ends within (450). --only: a comma list of checks, gemm, trace, peer,
# layer (all; the preflight always runs). --cases: (c)'s cases (default
# above); the first is the traced one.
#
# Exit status: 0 only when every step ran and passed and every case has its
# rows (report.py checks them); a skipped (77) or timed-out (124) check, a
# failed or missing run, or a missing row is a failure, named in run.log and
# at the head of gpu.md. 3: the preflight found something missing. 2: bad
# arguments. The acceptance targets (ring <= 0.8x PyTorch's time, <= 0.25x
# its device memory, the expert tasks' in-task GEMM rate >= 50% of cuBLAS's)
# are verdict lines of the table, not the exit status. A dry run against a
# StarPU without FxT skips (t) and says so; on a GPU that is a failure.
# RESULTS_DIR receives run.log, gpu_checks.log, gpu_checks.csv,
# gemm_rate.csv, tasks.rec, layer.csv, torch.jsonl, breakdown.csv and
# gpu.md (9 files, no folders).
#
# On a GPU machine lent through the device tool (one call; bench/gpu/README.md
# says how to make the bundle and what to do with the results):
#   device run, carry ["build-gpu"], timeout_s 540, command:
#     bench/gpu/run.sh --build build-gpu "$OUT"
# build-gpu/ (pack.sh's --out; ignored by .gitignore's build-*/) must lie in
# the checkout the session was started in: that is the tree the tool sends.
# The machine stays warm 30 s after a call: a rerun of what failed, at once,
#     bench/gpu/run.sh --build build-gpu --budget 240 --only layer --cases 65536:8 "$OUT"
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dry=0 build='' rounds=2 budget=450 results='' only=checks,gemm,trace,peer,layer cases_opt=''
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1; shift ;;
    --build|--rounds|--budget|--only|--cases)
      [ $# -ge 2 ] || { echo "run.sh: $1 needs a value (see --help)" >&2; exit 2; }
      case $1 in --build) build=$2 ;; --rounds) rounds=$2 ;; --budget) budget=$2 ;; --only) only=$2 ;;
                 --cases) cases_opt=$2 ;; esac
      shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [ -z "$results" ] || { echo "run.sh: one results folder, not '$results' and '$1'" >&2; exit 2; }
       results=$1; shift ;;
  esac
done
[ -n "$results" ] || { echo "run.sh: RESULTS_DIR missing (see --help)" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --rounds '$rounds': expected a positive integer" >&2; exit 2; }
[[ $budget =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --budget '$budget': expected seconds" >&2; exit 2; }
for s in ${only//,/ }; do
  case $s in checks|gemm|trace|peer|layer) ;;
    *) echo "run.sh: --only '$s': expected checks, gemm, trace, peer or layer" >&2; exit 2 ;; esac
done
want() { [[ ",$only," == *",$1,"* ]]; }
if [ -z "$build" ]; then
  for b in "$root/build-gpu" "$root/.gpu" "$root/build-cuda"; do [ -x "$b/apps/relaymoe" ] && { build=$b; break; }; done
fi
[ -n "$build" ] && [ -d "$build" ] || { echo "run.sh: no relaymoe build or bundle (--build DIR; tried build-gpu, .gpu, build-cuda)" >&2; exit 2; }
build=$(cd "$build" && pwd)
mkdir -p "$results" || exit 2
results=$(cd "$results" && pwd)
files=(run.log gpu_checks.log gpu_checks.csv gemm_rate.csv tasks.rec layer.csv torch.jsonl breakdown.csv gpu.md)
for f in "${files[@]}"; do rm -f "${results:?}/$f"; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/failures"

if [ $dry = 1 ]; then
  # PyTorch's CPU bf16 path (Debian's 1.13) is ten times less precise than
  # relaymoe's against float64 on the peer check's problem (2.4e-2 against
  # 2.9e-3): the dry run judges the peer's arithmetic more loosely, and
  # relaymoe's as on the GPU.
  gpu_env=(STARPU_NCPU=2 STARPU_NCUDA=0) io=host torch_dev=cpu peer_tol=5e-2
  H=128 F=48 E=128 default_cases="1024:8 256:8 1024:16" parts=8 repeat=2
else
  gpu_env=(STARPU_NCPU=0 STARPU_NCUDA=1) io=device torch_dev=cuda peer_tol=2e-2
  H=2048 F=768 E=128 default_cases="65536:8 16384:8 65536:16" parts=8 repeat=5
fi
cases=${cases_opt//,/ }
cases=${cases:-$default_cases}
for c in $cases; do
  [[ $c =~ ^[1-9][0-9]*:[1-9][0-9]*$ ]] || { echo "run.sh: --cases '$c': expected T:K" >&2; exit 2; }
done
# The first case: the traced one, and the one whose partition (rows per
# expert, experts per partition) rmoe_gemm_rate measures.
first=${cases%% *}
t0=${first%:*} k0=${first#*:}
cuda=${CUDA_HOME:-/usr/local/cuda}
# The bundle's libraries for relaymoe's programs only: its reference BLAS
# under OpenBLAS's name would break NumPy and PyTorch. CUDA's own folder
# too, in case the machine's loader does not list it; the preflight adds
# PyTorch's CUDA libraries where that folder lacks one.
libdirs=${LD_LIBRARY_PATH:-}
for d in "$cuda/lib64" "$build/lib"; do [ -d "$d" ] && libdirs=$d${libdirs:+:$libdirs}; done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export STARPU_SILENT=1 STARPU_WORKERS_NOBIND=1 STARPU_FXT_TRACE=0 PYTHONUNBUFFERED=1
export STARPU_HOME=${STARPU_HOME:-$tmp/starpu-home}
[ -d "$cuda/bin" ] && export PATH=$PATH:$cuda/bin
app=$build/apps/relaymoe
py=$(command -v python3 || echo python3)
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import numpy" 2>/dev/null && [ $dry = 1 ] && py=/usr/bin/python3
programs=(apps/relaymoe tests/unit/test_codelets tests/unit/test_codelets_router tests/unit/test_codelets_dispatch
          tests/unit/test_codelets_expert tests/unit/test_codelets_bf16 tests/mpi/test_raw bench/gpu/rmoe_gemm_rate)
start=$SECONDS
deadline=$((start + budget))
log() { echo "$*" | tee -a "$results/run.log"; }
elapsed() { echo $((SECONDS - start)); }
fail() { echo "$*" >>"$tmp/failures"; log "FAIL: $*"; }
# limit CAP RESERVE: CAP seconds cut to what the budget leaves once RESERVE
# seconds are kept for the steps after; 0 when nothing is left.
limit() {
  local left=$((deadline - SECONDS - $2))
  [ $left -lt 0 ] && left=0
  echo $(($1 < left ? $1 : left))
}
# The least each later step is kept (checks, gemm, peer, layer, report).
keep() {
  local sum=10 s
  for s in "$@"; do
    want "$s" || continue
    case $s in gemm) sum=$((sum + 20)) ;; trace) sum=$((sum + 30)) ;; peer) sum=$((sum + 30)) ;;
               layer) sum=$((sum + 120)) ;; esac
  done
  echo $sum
}
run_env() { env LD_LIBRARY_PATH="$libdirs" "$@"; }
lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }

log "bench/gpu/run.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) dry=$dry build=$build budget=${budget}s only=$only cases=${cases// /,} commit=$(cat "$build/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null)"

# ---- preflight -------------------------------------------------------------
# unresolved PROG...: the libraries ldd leaves unresolved, "LIB PROG" a line.
unresolved() {
  local p
  for p in "$@"; do
    [ -e "$p" ] || continue
    LD_LIBRARY_PATH=$libdirs ldd "$p" 2>/dev/null | awk -v p="${p#"$build"/}" '/not found/ {print $1, p}'
  done
}
# PyTorch's CUDA libraries (the nvidia-* wheels: nvidia/<lib>/lib, or
# nvidia/cu13/lib), then the toolkit's target folder.
extra_libdirs() {
  "$py" - <<'PY' 2>/dev/null
import glob, os, sys
roots = []
try:
    import nvidia
    roots += list(nvidia.__path__)
except Exception:
    pass
for site in sys.path:
    d = os.path.join(site, "nvidia")
    if os.path.isdir(d) and d not in roots:
        roots.append(d)
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib"))):
        print(d)
PY
  echo "$cuda/targets/x86_64-linux/lib"
}
preflight() {
  local t0=$SECONDS missing=() out rc p
  log "== preflight (at most 30 s)"
  # PyTorch and its CUDA, asked in the background while the rest runs.
  (timeout -k 2 20 "$py" -c "import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())" \
     >"$tmp/torch_probe" 2>&1; echo $? >"$tmp/torch_probe_rc") &
  local torch_pid=$!
  if ! command -v nvidia-smi >/dev/null; then
    missing+=("nvidia-smi: not on PATH (no NVIDIA driver here)")
  else
    out=$(timeout -k 2 8 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1); rc=$?
    if [ $rc -ne 0 ] || [ -z "$out" ]; then missing+=("a GPU: nvidia-smi exited $rc: $(head -1 <<<"$out")")
    else while read -r line; do log "found: GPU $line"; done <<<"$out"; fi
  fi
  if command -v mpirun >/dev/null; then
    log "found: mpirun $(command -v mpirun) ($(timeout -k 1 5 mpirun --version 2>&1 | head -1))"
  else missing+=("mpirun: not on PATH (Open MPI)"); fi
  if command -v compute-sanitizer >/dev/null; then log "found: compute-sanitizer $(command -v compute-sanitizer)"
  else missing+=("compute-sanitizer: not on PATH nor in $cuda/bin"); fi
  for p in "${programs[@]}"; do
    [ -x "$build/$p" ] || missing+=("$p: not in $build (pack.sh packs it from a -DRMOE_CUDA=ON build)")
  done
  # Libraries: what ldd cannot resolve is looked for in PyTorch's folders.
  local paths=() lost
  for p in "${programs[@]}"; do paths+=("$build/$p"); done
  lost=$(unresolved "${paths[@]}" | awk '{print $1}' | sort -u)
  if [ -n "$lost" ]; then
    local dirs d l
    dirs=$(extra_libdirs)
    for l in $lost; do
      for d in $dirs; do
        if [ -e "$d/$l" ]; then
          [[ ":$libdirs:" == *":$d:"* ]] || { libdirs=$libdirs:$d; log "found: $l in $d (added to the library path)"; }
          break
        fi
      done
    done
  fi
  while read -r l p; do
    [ -n "$l" ] && missing+=("$l: needed by $p, found neither by the loader, in $cuda/lib64, nor in PyTorch's nvidia/*/lib")
  done < <(unresolved "${paths[@]}" | sort -u)
  if [ -x "$app" ]; then
    local deps want_lib
    deps=$(LD_LIBRARY_PATH=$libdirs ldd "$app" "$build/bench/gpu/rmoe_gemm_rate" 2>/dev/null)
    for want_lib in libcudart.so.13 libcublas.so.13 libmpi.so.40 libhwloc.so.15 libstarpu-1.3.so.9 libstarpumpi-1.3.so.3; do
      out=$(grep -m1 "^[[:space:]]*$want_lib => /" <<<"$deps" | sed 's/^[[:space:]]*//; s/ (0x.*//')
      if [ -n "$out" ]; then log "found: $out"
      elif ! grep -q "$want_lib" <<<"$deps"; then
        missing+=("$want_lib: apps/relaymoe and rmoe_gemm_rate do not link it (CUDA 13, Open MPI 4, hwloc 2, StarPU 1.3 expected; a -DRMOE_CUDA=ON build?)")
      fi
    done
    # StarPU's own answer: a CUDA worker, or none.
    local t=$((30 - (SECONDS - t0) - 1))
    [ $t -gt 25 ] && t=25
    if [ $t -lt 3 ]; then
      missing+=("time to ask StarPU for a CUDA worker: the preflight's 30 s were spent")
    else
      out=$(run_env STARPU_NCPU=0 STARPU_NCUDA=1 timeout -k 2 $t "$app" run --hidden 64 --ffn 32 --experts 16 --topk 4 \
            --tokens 256 --repeat 1 --quiet --dispatch ring 2>&1); rc=$?
      local workers
      workers=$(grep -o "StarPU [^,]*, policy [^,]*, [0-9]* CPU and [0-9]* CUDA worker" <<<"$out" | head -1)
      if [ $rc -eq 0 ] && [[ $workers =~ \ ([1-9][0-9]*)\ CUDA\ worker ]]; then log "found: $workers(s)"
      else
        local why
        why=$(grep -m1 "relaymoe:" <<<"$out" || grep -m1 -i "error" <<<"$out" || head -1 <<<"$out")
        missing+=("a CUDA worker: StarPU found none (relaymoe run on CUDA workers only exited $rc$([ $rc = 124 ] && echo ", timed out after $t s"): ${why:0:300})")
      fi
    fi
  fi
  wait $torch_pid 2>/dev/null
  out=$(tail -1 "$tmp/torch_probe" 2>/dev/null)
  if [ "$(cat "$tmp/torch_probe_rc" 2>/dev/null)" = 0 ] && [[ $out == *" True "* ]]; then log "found: PyTorch $out (version, CUDA, GPUs) in $py"
  else missing+=("PyTorch with CUDA in $py: $(tr '\n' ' ' <"$tmp/torch_probe" 2>/dev/null | tail -c 200)"); fi
  log "preflight: $((SECONDS - t0)) s"
  [ ${#missing[@]} -eq 0 ] && return 0
  for p in "${missing[@]}"; do log "MISSING: $p"; done
  return 1
}
if [ $dry = 0 ] && ! preflight; then
  log "bench/gpu/run.sh: stopped after the preflight: the pieces named MISSING are needed ($(elapsed) s)"
  exit 3
fi

# ---- (a) the gpu label -----------------------------------------------------
checks=skipped
if want checks; then
  log "== (a) gpu checks ($(elapsed) s)"
  cap=120
  [ $dry = 1 ] && cap=300
  t=$(limit $cap "$(keep gemm trace peer layer)")
  if [ "$t" -le 0 ]; then checks="not run"; fail "gpu checks: not run, the budget was spent"
  else
    run_env GPU_CHECKS_DRY_RUN=$dry GPU_CHECKS_BUDGET="$t" timeout -k 5 $((t + 10)) \
      "$root/tests/gpu/gpu_checks.sh" "$build" mpirun "$results" >/dev/null 2>&1
    rc=$?
    tail -1 "$results/gpu_checks.log" 2>/dev/null | tee -a "$results/run.log"
    case $rc in
      0) checks=passed ;;
      77) checks="skipped: StarPU found no CUDA worker" ;;
      124|137) checks="timed out after $((t + 10)) s" ;;
      *) checks="FAILED (exit $rc, $(grep -c "^FAIL" "$results/gpu_checks.log" 2>/dev/null) failed: gpu_checks.log)" ;;
    esac
    log "gpu checks: $checks"
    [ $rc -eq 0 ] || fail "gpu checks: $checks"
  fi
fi

# ---- (b) the cuBLAS rate: the expert mix at the first case's rows per
# expert, and the launchers' GEMM ways over one of its partitions
gemm=skipped gemm_way=''
if want gemm; then
  log "== (b) cuBLAS bf16 GEMM rate and the expert GEMM ways ($(elapsed) s)"
  t=$(limit 40 "$(keep trace peer layer)")
  if [ ! -x "$build/bench/gpu/rmoe_gemm_rate" ]; then
    gemm="not built (a build without -DRMOE_CUDA=ON)"
    [ $dry = 1 ] && log "gemm rate: $gemm" || fail "gemm rate: $gemm"
  elif [ "$t" -le 0 ]; then gemm="not run"; fail "gemm rate: not run, the budget was spent"
  else
    run_env timeout -k 5 "$t" "$build/bench/gpu/rmoe_gemm_rate" --hidden $H --ffn $F --rows $((t0 * k0 / E)) \
      --experts $((E / parts)) --csv "$results/gemm_rate.csv" 2>&1 | tee -a "$results/run.log" "$tmp/gemm_rate.out"
    rc=${PIPESTATUS[0]}
    gemm_way=$(sed -n 's/^fastest: \(grouped\|strided\|loop\)$/\1/p' "$tmp/gemm_rate.out")
    [ $rc -eq 0 ] && log "expert GEMM way of the relaymoe runs: ${gemm_way:-the default (no fastest way read)}"
    case $rc in
      0) gemm=measured ;;
      77) gemm="no CUDA device" ;;
      124|137) gemm="timed out after $t s" ;;
      *) gemm="FAILED (exit $rc)" ;;
    esac
    if [ $rc -eq 0 ] || { [ $dry = 1 ] && [ $rc -eq 77 ]; }; then log "gemm rate: $gemm"; else fail "gemm rate: $gemm"; fi
  fi
fi
# Every relaymoe run of the layer: the fastest way, where one was measured.
way_env=()
[ -n "$gemm_way" ] && way_env=(RMOE_CUDA_GEMM="$gemm_way")

# ---- (t) one ring run traced, for the breakdown of a step by task kind
trace=skipped
if want trace; then
  log "== (t) the ring at T=$t0 K=$k0 traced ($(elapsed) s)"
  t=$(limit 60 "$(keep peer layer)")
  if [ "$t" -le 0 ]; then trace="not run"; fail "traced run: not run, the budget was spent"
  else
    run_env "${gpu_env[@]}" "${way_env[@]}" timeout -k 5 "$t" mpirun -np 1 --bind-to none "$app" run --hidden $H \
      --ffn $F --experts $E --topk "$k0" --tokens "$t0" --dtype bf16 --io $io --sched prio --repeat 2 --quiet \
      --dispatch ring --partitions $parts --trace "$tmp/trace" >"$tmp/trace.log" 2>&1
    rc=$?
    cat "$tmp/trace.log" >>"$results/run.log"
    if [ $rc -eq 0 ] && [ -s "$tmp/trace/tasks.rec" ] && cp "$tmp/trace/tasks.rec" "$results/tasks.rec"; then
      trace=recorded
    elif grep -q "has no FxT" "$tmp/trace.log"; then
      trace="skipped: the StarPU of the build has no FxT"
      [ $dry = 1 ] || fail "traced run: $trace"
    else
      trace="FAILED (exit $rc$([ $rc = 124 ] && echo ", timed out after $t s")$([ -s "$tmp/trace/tasks.rec" ] ||
        echo ", no tasks.rec"))"
      fail "traced run: $trace"
    fi
    log "traced run: $trace"
  fi
fi

# ---- (p) the peer is the same layer: its GPU path (grouped GEMM, bf16),
# with one group and with the ring's grouping, against a relaymoe dump.
peer=skipped torch_ok=1
if want peer; then
  log "== (p) the PyTorch peer against relaymoe ($(elapsed) s)"
  t=$(limit 25 "$(keep layer)")
  peer=
  if [ "$t" -le 0 ]; then peer="not run"; fail "PyTorch peer check: not run, the budget was spent"
  else
    run_env "${gpu_env[@]}" timeout -k 5 "$t" mpirun -np 1 --bind-to none "$app" run --hidden 128 --ffn 64 --experts 16 \
      --topk 4 --tokens 512 --dtype bf16 --dispatch ring --repeat 1 --quiet --dump "$tmp/dump" >>"$results/run.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || { peer="FAILED (the relaymoe dump exited $rc)"; fail "PyTorch peer check: $peer"; }
  fi
  for g in 1 4; do
    [ -z "$peer" ] || break
    t=$(limit 30 "$(keep layer)")
    [ "$t" -le 0 ] && { peer="not run"; fail "PyTorch peer check ($g groups): not run, the budget was spent"; break; }
    timeout -k 5 "$t" "$py" "$here/torch_moe.py" check "$tmp/dump" --topk 4 --device $torch_dev --dtype bf16 \
      --tol 2e-2 --peer-tol $peer_tol --groups $g 2>&1 | tail -1 | tee -a "$results/run.log"
    rc=${PIPESTATUS[0]}
    case $rc in
      0) ;;
      77) peer="skipped (no PyTorch)"; torch_ok=0
          [ $dry = 1 ] && log "PyTorch peer: $peer" || fail "PyTorch peer check: $peer" ;;
      124|137) peer="timed out after $t s"; fail "PyTorch peer check ($g groups): $peer" ;;
      *) peer="FAILED ($g groups, exit $rc)"; fail "PyTorch peer check: $peer" ;;
    esac
  done
  peer=${peer:-passed}
  log "PyTorch peer vs relaymoe: $peer"
fi

# ---- (c) the layer ---------------------------------------------------------
# The all-to-all's expert grouping: relaymoe's a2a computes per source rank
# and chunk over one group of all its E/N experts (cmd_run.c gives it one
# partition). When it takes a grouping of its own, pass the ring's here;
# report.py reads each row's grouping from its CSV (partitions).
a2a_grouping=()
layer_impls="ring a2a torch torch-part ring-live a2a-live"
[ $torch_ok = 1 ] || layer_impls="ring a2a ring-live a2a-live"
report() { # report [--quiet]: the table from what exists
  "$py" "$here/report.py" "$results" --checks "$checks" --gemm "$gemm" --peer "$peer" --trace "$trace" --dry-run $dry \
    --cases "$(want layer && echo "$cases")" --expect "$(want layer && echo "$layer_impls")" \
    --failures "$tmp/failures" "$@"
}
declare -A took
layer_end=$((deadline - 10))
# proc ROUND T K IMPL: one process of (c); 0 when it ran and left its row,
# 1 when it failed, 2 when it was not started (the pace or the budget).
proc() {
  local round=$1 t=$2 k=$3 impl=$4 key="$2:$3:$4" cap lim rc t0=$SECONDS before after file
  case $impl in torch*) cap=90; file=$results/torch.jsonl ;; *) cap=150; file=$results/layer.csv ;; esac
  lim=$((layer_end - SECONDS))
  [ $lim -gt $cap ] && lim=$cap
  if [ "$round" -gt 1 ]; then
    # A later round only repeats what round 1 timed, where its pace fits.
    local need=$(( ${took[$key]:-$cap} * 3 / 2 + 5 ))
    [ $need -le $lim ] || { log "  round $round T=$t K=$k $impl: not started, ~$need s needed, $lim s left"; return 2; }
  elif [ $lim -lt 5 ]; then
    fail "T=$t K=$k $impl: not run, the budget was spent"; return 2
  fi
  before=$(lines "$file")
  case $impl in
    torch|torch-part)
      timeout -k 5 $lim "$py" "$here/torch_moe.py" bench --hidden $H --ffn $F --experts $E --topk "$k" --tokens "$t" \
        --device $torch_dev --dtype bf16 --repeat $repeat --warmup 2 --groups "$([ "$impl" = torch ] && echo 1 || echo $parts)" \
        >"$tmp/torch.json" 2>>"$results/run.log"
      rc=$?
      [ $rc -eq 0 ] && [ -s "$tmp/torch.json" ] && sed "s/^{/{\"round\": $round, /" "$tmp/torch.json" >>"$file" ;;
    *)
      local args=(--dispatch "${impl%-live}") envs=("${gpu_env[@]}" "${way_env[@]}") reps=$repeat
      [ "${impl%-live}" = ring ] && args+=(--partitions "$parts")
      [ "${impl%-live}" = a2a ] && args+=("${a2a_grouping[@]}")
      [[ $impl == *-live ]] && { envs+=(RMOE_DEVICE_CACHE=off); reps=1; }
      run_env "${envs[@]}" timeout -k 5 $lim mpirun -np 1 --bind-to none "$app" run --hidden $H --ffn $F --experts $E \
        --topk "$k" --tokens "$t" --dtype bf16 --io $io --sched prio --repeat $reps --quiet --csv "$file" \
        "${args[@]}" >>"$results/run.log" 2>&1
      rc=$? ;;
  esac
  after=$(lines "$file")
  [ "$round" = 1 ] && took[$key]=$((SECONDS - t0))
  local what="rc=$rc, $((SECONDS - t0)) s"
  [ $rc = 124 ] || [ $rc = 137 ] && what+=", timed out at $lim s"
  if [ $rc -eq 0 ] && [ "$after" -gt "$before" ]; then log "  round $round T=$t K=$k $impl: $what"; return 0; fi
  fail "round $round T=$t K=$k $impl: $what$([ "$after" -gt "$before" ] || echo ', no result row')"
  return 1
}
if want layer; then
  log "== (c) the Qwen3-30B-A3B layer, bf16 ($(elapsed) s; until $((layer_end - start)) s)"
  for round in $(seq 1 "$rounds"); do
    stop=0
    for c in $cases; do
      t=${c%:*} k=${c#*:}
      for impl in $layer_impls; do
        [ "$round" -gt 1 ] && [[ $impl == *-live ]] && continue
        proc "$round" "$t" "$k" "$impl"
        [ $? -eq 2 ] && [ "$round" -gt 1 ] && { stop=1; break; }
      done
      [ $stop = 1 ] && break
      report --quiet >/dev/null 2>&1
    done
    [ $stop = 1 ] && { log "round $round stopped at the budget ($(elapsed) s)"; break; }
  done
fi

log "bench/gpu/run.sh: done in $(elapsed) s; the table (also in $results/gpu.md):"
report
rc=$?
[ $rc -eq 0 ] || echo "report: a case or a figure is missing (see the table)" >>"$tmp/failures"
if [ -s "$tmp/failures" ]; then
  log "bench/gpu/run.sh: FAILED: $(wc -l <"$tmp/failures") failure(s) above"
  exit 1
fi
exit 0
