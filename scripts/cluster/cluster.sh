#!/usr/bin/env bash
# Several hosts on one machine: a network namespace per host, a namespace of
# its own as the switch, veth pairs from each host to it, each host its own
# host name (a UTS namespace per process launched there), and Open MPI
# launching into them through its ssh launcher's agent. The recipe and what
# was checked: ../shared/notes/multihost-netns.md.
#
# Two networks, as on most clusters: the fabric (eth0, 192.168.77.0/24),
# which carries MPI's messages between hosts and is the one shaped and cut,
# and a management network (eth1, 192.168.78.0/24) for the launcher (mpirun
# and its daemons), never shaped or cut, so that a cut fabric link is
# something the ranks must notice, not the launcher. With --nics K a host
# has K fabric adapters (eth0, fab1, ..., each its own port on the switch,
# its own address on the fabric's subnet, its own shaping), as a node of
# MareNostrum 5 has one per GPU: a host's packets leave by the adapter of
# their source address (a routing table per adapter), and scripts/cluster/
# nic.sh, put before the program on mpirun's command line, binds each rank's
# MPI messages to adapter (local rank mod K).
#
# Every address and link lives inside namespaces this script creates; the
# machine's own namespace gets nothing (mpirun runs on the first host, as on
# a cluster's first node). Everything is named with the prefix (rmoeh), so a
# leftover of an interrupted run is found and removed by the next.
#
#   cluster.sh run [options] -- COMMAND [ARGS...]
#       brings the hosts up, runs COMMAND here with the environment below,
#       and tears everything down when it ends, fails or is interrupted
#       (EXIT, INT, TERM, HUP); exits with COMMAND's status. Runs are
#       serialised by a lock (one set of names).
#   cluster.sh leftovers     lists any namespace, bridge or veth of ours and
#                            exits 1, or exits 0 when there is none
#   cluster.sh clean         removes them (and the processes inside)
#   cluster.sh link HOST down|up [fabric|all]   inside a run: cut or restore
#                            host HOST's fabric link (its port on the switch),
#                            or both its links
#   cluster.sh shape RATE [DELAY]       inside a run: reshape the fabric
#
# options of run:
#   --hosts N      emulated hosts (default 2)
#   --ranks R      MPI slots per host in the hostfile (default 2)
#   --nics K       fabric adapters per host (default 1)
#   --rate RATE    each fabric adapter's link, each direction, as tc writes it
#                  (1gbit, 500mbit); default: unshaped (veth speed)
#   --delay D      added one-way delay per direction (100us, 1ms): netem, which
#                  some kernels lack (then an error, before anything runs)
#   --tcp-retries N  TCP inside the hosts gives up on an unanswering peer after
#                  N retransmissions (net.ipv4.tcp_retries2 of their
#                  namespaces; the kernel's 15 take about 15 minutes)
#   --keep DIR     write the run's files (hostfile, ...) into DIR and keep them
#
# COMMAND's environment:
#   RMOE_CLUSTER_MPIRUN    scripts/cluster/mpirun.sh: mpirun across the hosts
#   RMOE_CLUSTER_DIR       the run's folder (hostfile)
#   RMOE_CLUSTER_HOSTFILE  one line per host: MANAGEMENT_ADDRESS slots=R
#   RMOE_CLUSTER_HOSTS, RMOE_CLUSTER_RANKS, RMOE_CLUSTER_NP (= hosts x ranks)
#   RMOE_CLUSTER_SUBNET (fabric), RMOE_CLUSTER_MGMT_SUBNET
#   RMOE_CLUSTER_PREFIX, RMOE_CLUSTER_RATE, RMOE_CLUSTER_DELAY, RMOE_CLUSTER_NICS
#   RMOE_CLUSTER_SCRIPT    this script (for link and shape)
#   RMOE_CLUSTER_NIC       scripts/cluster/nic.sh: the program's prefix that
#                          binds a rank to its adapter (a plain exec with one)
#
#   scripts/cluster/cluster.sh run --hosts 2 --ranks 2 --rate 1gbit -- \
#     sh -c '"$RMOE_CLUSTER_MPIRUN" --map-by node hostname'
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
P=${RMOE_CLUSTER_PREFIX:-rmoeh}
# Host i is .(10 + i) of each /24; they exist only inside the namespaces
# (the switch has no address).
NET=192.168.77
MGMT=192.168.78
SW=${P}sw
lock=/run/lock/$P-cluster.lock
[ -d /run/lock ] || lock=/tmp/$P-cluster.lock

die() { echo "cluster.sh: $*" >&2; exit 2; }
say() { echo "cluster.sh: $*" >&2; }

host_ns() { echo "$P$1"; }
# Adapter j of host i: its device, its port on the switch, its address.
nic_dev() { if [ "$2" -eq 0 ]; then echo eth0; else echo "fab$2"; fi; }
nic_port() { if [ "$2" -eq 0 ]; then echo "${P}f$1"; else echo "${P}f$1n$2"; fi; }
nic_addr() { echo "$NET.$((10 + $2 * HOSTS + $1))"; }

# ---- what exists of ours --------------------------------------------------------

our_netns() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P" || true; }
# Links of ours in this (the machine's) namespace: none should ever be, as
# a run creates each veth end in its namespace; looked for all the same.
our_links() { ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^$P" || true; }

leftovers() {
  local ns links
  ns=$(our_netns)
  links=$(our_links)
  [ -z "$ns$links" ] && return 0
  # shellcheck disable=SC2086  # one line each
  [ -n "$ns" ] && echo "namespaces:" $ns
  # shellcheck disable=SC2086
  [ -n "$links" ] && echo "links:" $links
  return 1
}

# Ends the processes inside one of our namespaces (mpirun, Open MPI's
# daemons, the ranks: all started by a run), TERM first, then KILL.
kill_inside() {
  local ns=$1 pids
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [ -z "$pids" ] && return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null
  for _ in $(seq 1 20); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -z "$pids" ] && return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null
  for _ in $(seq 1 20); do
    [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && return 0
    sleep 0.1
  done
}

clean() {
  local ns l
  for ns in $(our_netns); do kill_inside "$ns"; done
  # Deleting a namespace deletes its veth ends, and with them their peers.
  for ns in $(our_netns); do ip netns del "$ns" 2>/dev/null || say "could not delete namespace $ns"; done
  for l in $(our_links); do ip link del "$l" 2>/dev/null; done
  leftovers >/dev/null
}

# ---- bringing hosts up -------------------------------------------------------------

rate_bits() {  # tc rate (kbit, mbit, gbit, bit) -> bits per second
  awk -v r="$1" 'BEGIN {
    n = r + 0; u = substr(r, length(n "") + 1)
    m = (u == "gbit") ? 1e9 : (u == "mbit") ? 1e6 : (u == "kbit") ? 1e3 : (u == "bit" || u == "") ? 1 : -1
    if (n <= 0 || m < 0) exit 1
    printf "%d\n", n * m }' || { say "rate '$1': expected a number with kbit, mbit or gbit"; return 1; }
}

# Shapes one veth end: tbf for the rate, with a bucket of 1 ms at the rate
# (at least 8 KiB: a slow link must not let a whole message through at veth
# speed; tbf cuts larger GSO segments itself) and a queue of 100 ms (at
# least 64 KiB, a TCP window rather than drops); netem above it for a delay.
shape_dev() {  # ns dev rate delay
  local ns=$1 dev=$2 rate=$3 delay=$4 parent=root bits burst limit
  tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null
  [ -z "$rate$delay" ] && return 0
  if [ -n "$delay" ]; then
    tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 100000 || return 1
    parent="parent 1:1"
  fi
  [ -z "$rate" ] && return 0
  bits=$(rate_bits "$rate") || return 1
  burst=$((bits / 8 / 1000))
  [ $burst -lt 8192 ] && burst=8192
  limit=$((bits / 8 / 10))
  [ $limit -lt 65536 ] && limit=65536
  # shellcheck disable=SC2086
  tc -n "$ns" qdisc add dev "$dev" $parent handle 10: tbf rate "$rate" burst "$burst" limit "$limit"
}

shape_fabric() {  # rate delay
  local i j
  for i in $(seq 0 $((HOSTS - 1))); do
    for j in $(seq 0 $((NICS - 1))); do
      # host -> switch (the adapter's uplink) and switch -> host (its downlink)
      shape_dev "$(host_ns "$i")" "$(nic_dev "$i" "$j")" "$1" "$2" || return 1
      shape_dev "$SW" "$(nic_port "$i" "$j")" "$1" "$2" || return 1
    done
  done
}

netem_available() {
  local ns=${P}probe ok=1
  ip netns add "$ns" 2>/dev/null || return 1
  ip -n "$ns" link add a type veth peer name b 2>/dev/null &&
    tc -n "$ns" qdisc add dev a root netem delay 1ms 2>/dev/null && ok=0
  ip netns del "$ns"
  return $ok
}

up() {
  ip netns add "$SW" || return 1
  local net dev br i ns
  for net in f m; do
    ip -n "$SW" link add "$P$net" type bridge || return 1
    ip -n "$SW" link set "$P$net" up || return 1
  done
  for i in $(seq 0 $((HOSTS - 1))); do
    ns=$(host_ns "$i")
    ip netns add "$ns" || return 1
    # eth0 on the fabric (port rmoehfI), eth1 on the management network
    # (port rmoehmI). Both ends are created in place: nothing ever appears
    # in the machine's namespace.
    for net in f m; do
      dev=eth0 br=${P}f
      [ $net = m ] && dev=eth1 br=${P}m
      ip link add "$dev" netns "$ns" type veth peer name "$P$net$i" netns "$SW" || return 1
      ip -n "$SW" link set "$P$net$i" master "$br" || return 1
      ip -n "$SW" link set "$P$net$i" up || return 1
      ip -n "$ns" link set "$dev" up || return 1
    done
    ip -n "$ns" addr add "$NET.$((10 + i))/24" dev eth0 || return 1
    ip -n "$ns" addr add "$MGMT.$((10 + i))/24" dev eth1 || return 1
    if [ "$NICS" -gt 1 ]; then
      nics_up "$i" "$ns" || return 1
    fi
    ip -n "$ns" link set lo up || return 1
    if [ -n "$RETRIES" ]; then
      ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_retries2="$RETRIES" || return 1
    fi
    echo "$MGMT.$((10 + i)) slots=$RANKS" >>"$DIR/hostfile"
  done
  # With STP off (a new bridge's default) ports forward at once.
  shape_fabric "$RATE" "$DELAY"
}

# A host's adapters 1..K-1 beside eth0, all on the fabric's subnet: each
# answers ARP for its own address only, and a packet leaves by the adapter
# its source address belongs to (rule: from that address, table 100 + j),
# so a rank bound to an adapter's address sends and receives over it.
nics_up() {  # host namespace
  local i=$1 ns=$2 j dev port addr
  ip netns exec "$ns" sysctl -q -w net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
    net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 >/dev/null || return 1
  for j in $(seq 1 $((NICS - 1))); do
    dev=$(nic_dev "$i" "$j") port=$(nic_port "$i" "$j") addr=$(nic_addr "$i" "$j")
    ip link add "$dev" netns "$ns" type veth peer name "$port" netns "$SW" || return 1
    ip -n "$SW" link set "$port" master "${P}f" || return 1
    ip -n "$SW" link set "$port" up || return 1
    ip -n "$ns" link set "$dev" up || return 1
    ip -n "$ns" addr add "$addr/24" dev "$dev" || return 1
  done
  for j in $(seq 0 $((NICS - 1))); do
    dev=$(nic_dev "$i" "$j") addr=$(nic_addr "$i" "$j")
    ip -n "$ns" route add "$NET.0/24" dev "$dev" src "$addr" table $((100 + j)) || return 1
    ip -n "$ns" rule add from "$addr" table $((100 + j)) || return 1
  done
}

# ---- commands -------------------------------------------------------------------------

cmd_run() {
  HOSTS=2 RANKS=2 NICS=1 RATE='' DELAY='' KEEP='' RETRIES=''
  while [ $# -gt 0 ]; do
    case $1 in
      --hosts) HOSTS=$2; shift 2 ;;
      --ranks) RANKS=$2; shift 2 ;;
      --nics) NICS=$2; shift 2 ;;
      --rate) RATE=$2; shift 2 ;;
      --delay) DELAY=$2; shift 2 ;;
      --keep) KEEP=$2; shift 2 ;;
      --tcp-retries) RETRIES=$2; shift 2 ;;
      --) shift; break ;;
      *) die "run: unknown option '$1' (see the head of $0)" ;;
    esac
  done
  [ $# -gt 0 ] || die "run: expected -- COMMAND"
  [[ $HOSTS =~ ^[0-9]+$ ]] && [ "$HOSTS" -ge 1 ] && [ "$HOSTS" -le 200 ] || die "--hosts $HOSTS: expected 1 to 200"
  [[ $RANKS =~ ^[0-9]+$ ]] && [ "$RANKS" -ge 1 ] || die "--ranks $RANKS: expected a positive count"
  [[ $NICS =~ ^[0-9]+$ ]] && [ "$NICS" -ge 1 ] && [ "$NICS" -le 16 ] && [ $((NICS * HOSTS)) -le 240 ] ||
    die "--nics $NICS: expected 1 to 16 adapters per host, at most 240 in all (one /24)"
  [ -z "$RATE" ] || rate_bits "$RATE" >/dev/null || exit 2
  [ -z "$RETRIES" ] || { [[ $RETRIES =~ ^[0-9]+$ ]] && [ "$RETRIES" -ge 1 ] && [ "$RETRIES" -le 15 ]; } ||
    die "--tcp-retries $RETRIES: expected 1 to 15"
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
  command -v ip >/dev/null && command -v tc >/dev/null || die "needs iproute2 (ip, tc)"
  command -v unshare >/dev/null || die "needs unshare (util-linux)"

  exec 9>"$lock" || die "cannot open the lock $lock"
  flock -w 900 9 || die "another run held $lock for 15 minutes"
  # Under the lock nothing of ours may exist: what does is an interrupted
  # run's.
  if ! leftovers >/dev/null; then
    say "removing what an earlier run left: $(leftovers | tr '\n' ' ')"
    clean || die "could not remove the earlier run's leftovers: $(leftovers | tr '\n' ' ')"
  fi
  if [ -n "$KEEP" ]; then
    mkdir -p "$KEEP" && DIR=$(cd "$KEEP" && pwd) || die "--keep $KEEP: cannot create"
    rm -f "$DIR/hostfile"
  else
    DIR=$(mktemp -d "/tmp/$P.XXXXXX")
  fi
  child=
  teardown() {
    local rc=$?
    trap - EXIT INT TERM HUP
    [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
    clean
    if ! leftovers >/dev/null; then
      say "teardown left: $(leftovers | tr '\n' ' ')"
      [ $rc -eq 0 ] && rc=1
    fi
    [ -z "$KEEP" ] && rm -rf "$DIR"
    exit $rc
  }
  trap teardown EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  if [ -n "$DELAY" ] && ! netem_available; then
    die "--delay $DELAY: this kernel has no netem qdisc (sch_netem); links can be shaped in rate only"
  fi
  up || { say "bringing up $HOSTS hosts failed"; exit 1; }
  export RMOE_CLUSTER_DIR=$DIR RMOE_CLUSTER_HOSTFILE=$DIR/hostfile RMOE_CLUSTER_HOSTS=$HOSTS
  export RMOE_CLUSTER_RANKS=$RANKS RMOE_CLUSTER_NP=$((HOSTS * RANKS)) RMOE_CLUSTER_PREFIX=$P
  export RMOE_CLUSTER_SUBNET=$NET.0/24 RMOE_CLUSTER_MGMT_SUBNET=$MGMT.0/24
  export RMOE_CLUSTER_RATE=$RATE RMOE_CLUSTER_DELAY=$DELAY RMOE_CLUSTER_NICS=$NICS
  export RMOE_CLUSTER_NIC=$here/nic.sh
  export RMOE_CLUSTER_MPIRUN=$here/mpirun.sh RMOE_CLUSTER_SCRIPT=$here/cluster.sh
  say "$HOSTS host(s) x $RANKS slot(s) up (${P}0..$P$((HOSTS - 1)), fabric $NET.10-$((9 + HOSTS * NICS)), $NICS adapter(s) a host" \
      "${RATE:-unshaped}${DELAY:+ +$DELAY}, management $MGMT.10-$((9 + HOSTS)))"
  # In the background, so that a signal reaches the trap at once.
  "$@" &
  child=$!
  wait "$child"
  local rc=$?
  child=
  exit $rc
}

in_run() {
  [ -n "${RMOE_CLUSTER_DIR:-}" ] && [ -n "${RMOE_CLUSTER_HOSTS:-}" ] ||
    die "$1: only inside cluster.sh run (RMOE_CLUSTER_* not set)"
  HOSTS=$RMOE_CLUSTER_HOSTS NICS=${RMOE_CLUSTER_NICS:-1}
}

cmd_link() {
  in_run link
  local h=${1:-} state=${2:-} which=${3:-fabric} nets
  [[ $h =~ ^[0-9]+$ ]] && [ "$h" -lt "$HOSTS" ] || die "link: host '$h': expected 0 to $((HOSTS - 1))"
  case $state in down | up) ;; *) die "link $h: expected down or up" ;; esac
  case $which in fabric) nets=f ;; all) nets="f m" ;; *) die "link $h $state: expected fabric or all" ;; esac
  # The host's port on the switch: the host's end loses its carrier and
  # drops what it sends but keeps its address and routes, as a NIC whose
  # cable is pulled; nothing fails at once, so every process must notice
  # the cut by waiting, as on a cluster.
  local n j
  for n in $nets; do ip -n "$SW" link set "$P$n$h" "$state" || return 1; done
  for j in $(seq 1 $((NICS - 1))); do ip -n "$SW" link set "$(nic_port "$h" "$j")" "$state" || return 1; done
}

cmd_shape() {
  in_run shape
  [ -z "${1:-}" ] || rate_bits "$1" >/dev/null || exit 2
  shape_fabric "${1:-}" "${2:-}"
}

case ${1:-} in
  run) shift; cmd_run "$@" ;;
  leftovers) leftovers ;;
  clean)
    [ "$(id -u)" -eq 0 ] || die "needs root"
    clean || { echo "still there: $(leftovers | tr '\n' ' ')" >&2; exit 1; } ;;
  link) shift; cmd_link "$@" ;;
  shape) shift; cmd_shape "$@" ;;
  *) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
