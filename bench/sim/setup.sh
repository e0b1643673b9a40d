# Sourced by bench/sim/run.sh and bench/sim/sched.sh: the checks and set-up
# of the options they share. The caller defines die() and sets eps,
# dispatches, cluster, app, prefix, history, history_host and gpu_tflops (empty: the cluster
# file's bf16_tflops); sim_setup makes the paths absolute (the runs start in
# their work folder), fills gpu_tflops and raises vm.max_map_count.
sim_setup() {
  local e d
  for e in $eps; do [[ $e =~ ^[0-9]+$ ]] && [ "$e" -ge 1 ] || die "--ep: '$e' is not a rank count"; done
  for d in $dispatches; do case $d in ring|token|a2a) ;; *) die "--dispatch: '$d' is not ring, token or a2a" ;; esac; done
  [ -f "$cluster" ] || die "--cluster $cluster: no such file"
  [ -x "$app" ] || die "no relaymoe simulation build at $app (cmake -DRMOE_SIMGRID=ON, see README)"
  [ -x "$prefix/bin/starpu_smpirun" ] || die "no starpu_smpirun in $prefix/bin (scripts/build-starpu.sh --prefix $prefix --simgrid)"
  prefix=$(cd "$prefix" && pwd)
  app=$(cd "$(dirname "$app")" && pwd)/$(basename "$app")
  if [ -n "$history" ]; then
    [ -n "$history_host" ] || die "--history needs --history-host (the recording's STARPU_HOSTNAME)"
    [ -d "$history/.starpu/sampling/codelets/45" ] ||
      die "--history $history: no .starpu/sampling/codelets/45 (bench/sim/calibrate.sh --out $history)"
    history=$(cd "$history" && pwd)
  fi
  if [ -z "$gpu_tflops" ]; then
    gpu_tflops=$(sed -n 's/^[[:space:]]*bf16_tflops[[:space:]]*=[[:space:]]*\([0-9.eE+-]*\).*/\1/p' "$cluster" | head -n 1)
    [ -n "$gpu_tflops" ] || die "$cluster has no bf16_tflops: give --gpu-tflops"
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

# sim_opt OPTION VALUE: stores the value of an option run.sh and sched.sh
# share; 1 when OPTION is not one of them.
sim_opt() {
  case "$1" in
    --ep) eps=$2 ;;
    --dispatch) dispatches=$2 ;;
    --preset) preset=$2 ;;
    --scale) scale=$2 ;;
    --cluster) cluster=$2 ;;
    --gpu-tflops) gpu_tflops=$2 ;;
    --gpu-gbs) gpu_gbs=$2 ;;
    --floor-us) floor_us=$2 ;;
    --history) history=$2 ;;
    --history-host) history_host=$2 ;;
    --timeout) tmo=$2 ;;
    --app) app=$2 ;;
    --prefix) prefix=$2 ;;
    --out) out=$2 ;;
    --keep) keep=$2 ;;
    *) return 1 ;;
  esac
}
