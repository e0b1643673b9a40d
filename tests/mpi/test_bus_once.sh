#!/usr/bin/env bash
# StarPU's first start on a host where several ranks share a node: one rank
# measures the buses alone, the others start after it (graph/context/ctx_bus.c,
# rmoe_ctx_calibrate_bus_once; two ranks measuring together made StarPU abort on a
# half-written affinity file). In a fresh StarPU home, 4 ranks of one node:
# the first run says exactly once that a rank measures, passes --check and
# leaves the host's bus files; the second run finds them and says nothing.
#   test_bus_once.sh MPIEXEC RELAYMOE WORK
set -uo pipefail
mpiexec=$1 app=$2 work=$3
rm -rf "$work" && mkdir -p "$work/home"
export STARPU_HOME=$work/home
unset STARPU_SILENT XDG_CACHE_HOME STARPU_PERF_MODEL_DIR STARPU_HOSTNAME
host=$(hostname) && host=${host%%.*}
fails=0
bad() { echo "test_bus_once: FAIL: $*"; fails=$((fails + 1)); }
for i in 1 2; do
  timeout -k 5 180 "$mpiexec" -n 4 --oversubscribe "$app" run --hidden 64 --ffn 32 --experts 8 --topk 2 \
    --tokens 96 --dispatch ring --check --quiet >"$work/run$i.log" 2>&1
  rc=$?
  said=$(grep -c "measures this host's buses for StarPU alone" "$work/run$i.log")
  want=$((i == 1 ? 1 : 0))
  [ "$rc" -eq 0 ] || bad "run $i exited $rc (log: $work/run$i.log)"
  grep -q "check ring vs reference: .*PASS" "$work/run$i.log" || bad "run $i: no --check PASS (log: $work/run$i.log)"
  [ "$said" -eq "$want" ] || bad "run $i: $said rank(s) said they measure the buses alone, expected $want"
  for k in bandwidth config latency; do
    [ -s "$work/home/.starpu/sampling/bus/$host.$k" ] || bad "run $i left no $host.$k in the StarPU home"
  done
  echo "test_bus_once: run $i: exit $rc, $said rank(s) measured the buses alone (expected $want)"
done
[ "$fails" -eq 0 ] && echo "test_bus_once: PASS" || exit 1
