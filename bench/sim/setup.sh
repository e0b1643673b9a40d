# Sourced by bench/sim/run.sh and bench/sim/sched.sh (after $root is set):
# the options they share, their defaults, checks and set-up. The caller
# defines die() and sets dispatches; gpu_tflops empty means the cluster
# file's bf16_tflops; sim_setup makes the paths absolute (the runs start in
# their work folder), fills gpu_tflops and raises vm.max_map_count.
# shellcheck source=bench/sim/commit.sh
. "$root/bench/sim/commit.sh"
sim_setup() {
  local e d
  for e in $eps; do [[ $e =~ ^[0-9]+$ ]] && [ "$e" -ge 1 ] || die "--ep: '$e' is not a rank count"; done
  # Any single dispatcher `relaymoe run --dispatch` accepts (its --help of
  # the real build lists them), so one added there runs here by name.
  local known=''
  [ -x "$root/build/apps/relaymoe" ] &&
    known=$("$root/build/apps/relaymoe" run --help 2>/dev/null | sed -n 's/^ *--dispatch D *//p' | tr -c 'a-z0-9-\n' ' ')
  for d in $dispatches; do
    [[ $d =~ ^[a-z0-9][a-z0-9-]*$ ]] || die "--dispatch: '$d' is not a dispatcher name"
    case $d in auto|both|baselines|all) die "--dispatch: '$d' names several or a choice: give single dispatchers" ;; esac
    # ring-striped, token-striped: run.sh's variants of the rings (their
    # crossing hops striped).
    [ -z "$known" ] || [ "$d" = ring-striped ] || [ "$d" = token-striped ] || [[ " $known " == *" $d "* ]] ||
      die "--dispatch: relaymoe run does not know '$d' (it knows:$known ring-striped token-striped)"
  done
  case $transport in staged|gpudirect) ;; *) die "--transport: '$transport' is not staged or gpudirect" ;; esac
  case $dtype in bf16|f32) ;; *) die "--dtype: '$dtype' is not bf16 or f32" ;; esac
  # The commit every row records: the tree's, marked when tracked files
  # differ from it; bench/sim/all.sh takes it once for all its sweeps
  # (RMOE_SIM_COMMIT), so a sweep that runs long records where it started.
  sim_commit=${RMOE_SIM_COMMIT:-$(sim_tree_commit "$root")}
  [ -f "$cluster" ] || die "--cluster $cluster: no such file"
  [ -x "$app" ] || die "no relaymoe simulation build at $app (cmake -DRMOE_SIMGRID=ON, see docs/simulation.md)"
  [ -x "$prefix/bin/starpu_smpirun" ] || die "no starpu_smpirun in $prefix/bin (scripts/build-starpu.sh --prefix $prefix --simgrid)"
  prefix=$(cd "$prefix" && pwd)
  app=$(cd "$(dirname "$app")" && pwd)/$(basename "$app")
  if [ -n "$history" ]; then
    [ -n "$history_host" ] || die "--history needs --history-host (the recording's STARPU_HOSTNAME)"
    [ -d "$history/.starpu/sampling/codelets/45" ] ||
      die "--history $history: no .starpu/sampling/codelets/45 (bench/sim/calibrate.sh --out $history)"
    history=$(cd "$history" && pwd)
  fi
  # GEMMs at the rate of the element type the tensors have on every link:
  # the file's bf16_tflops for bf16, its f32_tflops for f32.
  if [ -z "$gpu_tflops" ]; then
    gpu_tflops=$(sed -n "s/^[[:space:]]*${dtype}_tflops[[:space:]]*=[[:space:]]*\([0-9.eE+-]*\).*/\1/p" "$cluster" | head -n 1)
    [ -n "$gpu_tflops" ] || die "$cluster has no ${dtype}_tflops: give --gpu-tflops"
  fi
  # Every run goes under `setarch -R` where the kernel allows it
  # (scripts/lib/norand.sh says why; sim_norand is empty where it does not).
  # shellcheck source=../../scripts/lib/norand.sh
  . "$root/scripts/lib/norand.sh"
  rmoe_norand
  sim_norand=("${rmoe_norand[@]}")
  if [ "${#sim_norand[@]}" -eq 0 ]; then
    echo "sim: warning: setarch -R is not permitted here; runs of many ranks may differ slightly from run to run" >&2
  fi
  # SimGrid maps a stack per simulated thread and StarPU's folded
  # allocations map pages again and again: 64 ranks pass Linux's default of
  # 65530 mappings per process ("Failed to protect stack: Cannot allocate memory").
  local maps
  maps=$(cat /proc/sys/vm/max_map_count 2>/dev/null || echo 0)
  if [ "$maps" -lt 1048576 ]; then
    if [ "$(id -u)" -eq 0 ] && sysctl -qw vm.max_map_count=1048576 2>/dev/null; then
      echo "sim: raised vm.max_map_count from $maps to 1048576 (SimGrid and folded memory need many mappings)"
    else
      echo "sim: warning: vm.max_map_count is $maps; runs of 32 ranks and more may abort (as root: sysctl -w vm.max_map_count=1048576)" >&2
    fi
  fi
}

# The options run.sh and sched.sh share, for opts_parse (scripts/lib/opts.sh,
# sourced first), and their defaults (a script sets its own after this).
eps="8 16 32 64" preset=Qwen3-30B-A3B cluster=$root/scheduler/clusters/mn5-acc.cluster
transport=gpudirect dtype=bf16
gpu_tflops='' gpu_gbs=2500 floor_us=20 history='' history_host=''
app=$root/build-sim/apps/relaymoe prefix=/opt/starpu-sim out=$root/bench/results keep=''
OPT_VALUE+=([--ep]=eps [--dispatch]=dispatches [--preset]=preset [--scale]=scale [--cluster]=cluster
  [--gpu-tflops]=gpu_tflops [--gpu-gbs]=gpu_gbs [--floor-us]=floor_us [--history]=history
  [--history-host]=history_host [--transport]=transport [--dtype]=dtype [--timeout]=tmo [--app]=app [--prefix]=prefix [--out]=out [--keep]=keep)
