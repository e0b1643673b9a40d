#!/usr/bin/env bash
# mpirun across the emulated hosts of a `cluster.sh run` (its environment
# names them): started on the first host, as on a cluster's first node, with
# the run's hostfile, the launcher agent for the others, the launcher's own
# traffic on the management network, MPI's messages between hosts over TCP
# on the fabric and through shared memory inside a host, and what relaymoe's
# ranks need on a small machine (scripts/mpirun.sh: no binding, MPI yielding
# when idle, one StarPU CPU worker per rank).
#   "$RMOE_CLUSTER_MPIRUN" [mpirun options] PROGRAM [ARGS...]
# Placement is mpirun's: by slot (host 0 filled first) unless --map-by node
# (ranks dealt round-robin over the hosts).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ -n "${RMOE_CLUSTER_HOSTFILE:-}" ] || { echo "mpirun.sh: only inside scripts/cluster/cluster.sh run" >&2; exit 2; }
export STARPU_SILENT=${STARPU_SILENT:-1}
export STARPU_NCPU=${STARPU_NCPU:-1}
export STARPU_WORKERS_NOBIND=${STARPU_WORKERS_NOBIND:-1}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
# shellcheck disable=SC2054  # "self,vader,tcp" is one argument
args=(--hostfile "$RMOE_CLUSTER_HOSTFILE"
      --mca plm_rsh_agent "$here/agent.sh" --mca plm_rsh_no_tree_spawn 1
      --mca oob_tcp_if_include "$RMOE_CLUSTER_MGMT_SUBNET" --mca btl_tcp_if_include "$RMOE_CLUSTER_SUBNET"
      --mca btl self,vader,tcp --bind-to none --mca mpi_yield_when_idle 1
      -x STARPU_SILENT -x STARPU_NCPU -x STARPU_WORKERS_NOBIND -x OPENBLAS_NUM_THREADS)
for v in STARPU_HOME STARPU_SCHED RMOE_WAIT_TIMEOUT LD_LIBRARY_PATH RMOE_CLUSTER_NICS; do
  [ -n "${!v:-}" ] && args+=(-x "$v")
done
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
first=${RMOE_CLUSTER_PREFIX}0
exec ip netns exec "$first" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$first" mpirun "${args[@]}" "$@"
