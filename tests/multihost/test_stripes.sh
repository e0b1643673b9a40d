#!/usr/bin/env bash
# The striped rings across emulated hosts with an adapter per rank
# (scripts/cluster/ --nics 2): 2 hosts x 2 ranks, each rank's messages
# between hosts bound to its own shaped link (scripts/cluster/nic.sh), as
# each GPU of a MareNostrum 5 node has its own adapter. For expert and
# token routing, the flat ring (--stripes 1) and the striped one (as
# planned: 2 stripes, one per rank of a host):
#  1. relaymoe run --check passes against the reference;
#  2. what the first host sends over its two adapters: the flat ring's hops
#     leave it over one adapter (the other carries under 5% of it: the
#     ranks are bound to their links), the striped ring's over both (each
#     carries 40-60% of the two's bytes).
#   test_stripes.sh RELAYMOE SOURCE_DIR WORK
# Needs root (network namespaces) and iproute2; exit 77 without them.
set -uo pipefail
app=$1 src=$2 work=$3
# shellcheck source=tests/multihost/lib.sh
. "$src/tests/multihost/lib.sh"
enter_hosts "$src" "$work" --hosts 2 --ranks 2 --nics 2 --rate 1gbit -- "$0" "$@"
py=/usr/bin/python3
layer=(--hidden 256 --ffn 128 --experts 8 --topk 2 --tokens 256)
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
# Bytes host 0 sent over adapter $1.
sent() {
  ip -n "${RMOE_CLUSTER_PREFIX}0" -s -j link show "$1" |
    $py -c 'import json, sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])'
}

for d in ring token; do
  for s in 1 0; do
    e0=$(sent eth0) f1=$(sent fab1)
    out=$(timeout -k 5 240 "$RMOE_CLUSTER_MPIRUN" "$RMOE_CLUSTER_NIC" "$app" run "${layer[@]}" --dispatch "$d" \
          --stripes "$s" --check --repeat 1 --quiet 2>&1)
    rc=$?
    e0=$(( $(sent eth0) - e0 )) f1=$(( $(sent fab1) - f1 ))
    what="$d --stripes $s"
    if [ $rc -eq 0 ] && grep -q "check $d vs reference.*PASS" <<<"$out"; then
      ok "$what: --check PASS across 2 hosts with an adapter per rank"
    else
      bad "$what: relaymoe run --check (exit $rc)"; echo "$out"
    fi
    total=$((e0 + f1))
    if [ "$total" -lt 100000 ]; then
      bad "$what: host 0 sent $total bytes over its adapters: the hops did not leave it"
    elif [ "$s" = 1 ] && [ $((e0 * 20)) -lt "$f1" ]; then
      ok "$what: host 0's hops left over one adapter (eth0 $e0 B, fab1 $f1 B)"
    elif [ "$s" = 0 ] && [ $((e0 * 10)) -ge $((total * 4)) ] && [ $((e0 * 10)) -le $((total * 6)) ]; then
      ok "$what: host 0's hops left over both adapters (eth0 $e0 B, fab1 $f1 B)"
    else
      bad "$what: host 0's adapters carried eth0 $e0 B, fab1 $f1 B"
    fi
  done
done
[ $fails -eq 0 ] && exit 0 || exit 1
