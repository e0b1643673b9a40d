#!/usr/bin/env bash
# mpirun with what relaymoe's ranks need on a workstation or a CI machine:
# more ranks than cores allowed (--oversubscribe), root allowed when running
# as root, no binding of a whole rank to one core (StarPU places its own
# threads), MPI yielding when idle (a rank's StarPU worker and progress
# thread spin on the same cores: bench/results/hop.md measured a 1 MB hop at
# 26x plain MPI without it and 5.5x with it, --bind-to none included), and
# one StarPU CPU worker per rank unless STARPU_NCPU says otherwise.
# OpenBLAS's threads are the library's choice (rmoe_ctx_config.blas_threads:
# the cores of the rank's share its workers leave, so 2 threads for 1 rank
# on 2 cores, 1 for 2 ranks) unless OPENBLAS_NUM_THREADS says otherwise.
#   scripts/mpirun.sh -np 4 build/apps/relaymoe run
set -euo pipefail
args=(--oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
export STARPU_SILENT=${STARPU_SILENT:-1}
export STARPU_NCPU=${STARPU_NCPU:-1}
export STARPU_WORKERS_NOBIND=${STARPU_WORKERS_NOBIND:-1}
exec mpirun "${args[@]}" "$@"
