# Sourced by the multihost tests. Outside a cluster.sh run, enter_hosts checks
# what emulated hosts need (root, iproute2, unshare; exit 77 without them),
# makes WORK fresh and runs the test again inside `cluster.sh run ARGS`
# (ARGS end with -- "$0" "$@"); inside one it returns.
#   enter_hosts SOURCE_DIR WORK ARGS...
enter_hosts() {
  local src=$1 work=$2
  shift 2
  [ -z "${RMOE_CLUSTER_DIR:-}" ] || return 0
  [ "$(id -u)" -eq 0 ] || { echo "needs root: network namespaces"; exit 77; }
  command -v ip >/dev/null && command -v unshare >/dev/null || { echo "needs iproute2 and unshare"; exit 77; }
  rm -rf "$work" && mkdir -p "$work"
  exec "$src/scripts/cluster/cluster.sh" run "$@"
}
