# Sourced: exports OPENBLAS_CORETYPE, where the user has not set it, as the
# kernel set the relaymoe command of build $1 runs with. The command corrects
# OpenBLAS's choice on CPUs newer than the library (it re-runs itself with
# OPENBLAS_CORETYPE set, rmoe_blas_core_advice); tests, benchmarks and
# embedding programs started next to it then run the same GEMM kernels.
rmoe_blas_env() {
  local exe=$1/apps/relaymoe core
  [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -x "$exe" ] || return 0
  core=$("$exe" --blas-core 2>/dev/null) || return 0
  case $core in
    ''|unknown) ;;
    *) export OPENBLAS_CORETYPE=$core ;;
  esac
}
