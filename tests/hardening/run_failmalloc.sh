#!/usr/bin/env bash
# Runs a command with failmalloc.so preloaded: allocations over BYTES fail in
# MPI rank RANK only, or in every process when RANK is "" (nothing MPI or StarPU allocates at start-up is as large
# as the sizes the tests use).
#   run_failmalloc.sh SHIM SANITIZE BYTES RANK COMMAND...
set -uo pipefail
shim=$1 sanitize=$2 bytes=$3 rank=$4
shift 4
case "$sanitize" in
  ON|on|1|TRUE|true) echo "sanitizer build: its allocator cannot be interposed"; exit 77 ;;
esac
exec env LD_PRELOAD="$shim" RMOE_FAILMALLOC_ABOVE="$bytes" RMOE_FAILMALLOC_RANK="$rank" timeout 100 "$@"
