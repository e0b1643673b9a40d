#!/usr/bin/env bash
# The layer across emulated hosts (scripts/cluster/): 2 hosts x 2 ranks,
# placed by slot (ranks 0, 1 on the first host) and interleaved (--map-by
# node: 0, 2 on the first). For each placement:
#  1. relaymoe plan under the same mpirun finds 2 nodes from the MPI host
#     names and plans a ring that crosses between them 2 times, the fewest a
#     ring over 2 nodes can; rank order crosses 4 times when interleaved;
#  2. relaymoe run --check of ring, token and both all-to-alls passes against the
#     reference, with the plan's ring, and the hosts' links carried it
#     (their interfaces' byte counters grew: TCP between hosts, not shared
#     memory);
#  3. interleaved only: the ring in rank order (--ring-order rank), which
#     crosses on every edge, passes --check too.
#   test_across_hosts.sh RELAYMOE SOURCE_DIR WORK
# Needs root (network namespaces) and iproute2; exit 77 without them.
set -uo pipefail
app=$1 src=$2 work=$3
# shellcheck source=tests/multihost/lib.sh
. "$src/tests/multihost/lib.sh"
enter_hosts "$src" "$work" --hosts 2 --ranks 2 -- "$0" "$@"
py=/usr/bin/python3
layer=(--hidden 64 --ffn 32 --experts 8 --topk 2 --tokens 96)
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
mpirun_() { timeout -k 5 "$1" "$RMOE_CLUSTER_MPIRUN" "${@:2}"; }
# Bytes host $1 sent and received over its link.
link_bytes() {
  ip -n "${RMOE_CLUSTER_PREFIX}$1" -s -j link show eth0 |
    $py -c 'import json, sys; s = json.load(sys.stdin)[0]["stats64"]; print(s["rx"]["bytes"] + s["tx"]["bytes"])'
}

for map in slot node; do
  # 1. the plan under this mpirun: nodes, order, crossings, in both orders
  for order in planned rank; do
    mpirun_ 60 --map-by "$map" "$app" plan "${layer[@]}" --ring-order "$order" --json >"$work/plan-$map-$order.json"
    rc=$?
    [ $rc -eq 0 ] || { bad "$map: relaymoe plan --ring-order $order exited $rc"; cat "$work/plan-$map-$order.json"; }
  done
  chk=$($py - "$work/plan-$map-planned.json" "$work/plan-$map-rank.json" "$map" <<'EOF'
import json, sys
planned, ranked, placement = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
for p in (planned, ranked):
    assert p["cluster"]["live"] is True and p["cluster"]["nodes"] == 2, p["cluster"]
    assert p["cluster"]["placement"] == "MPI host names", p["cluster"]["placement"]
ring = planned["ring"]
# The fewest crossings a ring over N nodes can make is N.
assert ring["node_crossings"] == planned["cluster"]["nodes"] == 2, ring
nodes = {e["from"]: e["from_node"] for e in ring["edges"]}
expect = {"slot": {0: 0, 1: 0, 2: 1, 3: 1}, "node": {0: 0, 1: 1, 2: 0, 3: 1}}[placement]
assert nodes == expect, (nodes, expect)
assert ranked["ring"]["order"] == [0, 1, 2, 3]
assert ranked["ring"]["node_crossings"] == {"slot": 2, "node": 4}[placement], ranked["ring"]
print(" ".join(map(str, ring["order"])), ranked["ring"]["node_crossings"])
EOF
  ) && read -r -a got <<<"$chk" && planned_order=${got[*]:0:4} && ok "$map: plan under mpirun: 2 nodes from the host names, ring $planned_order crosses 2 times (the minimum); rank order ${got[4]}" ||
    { bad "$map: the plan's nodes and crossings"; echo "$chk"; planned_order=; }

  # 2. ring, token and every all-to-all across the hosts, against the reference
  before=$(( $(link_bytes 0) + $(link_bytes 1) ))
  out=$(mpirun_ 300 --map-by "$map" "$app" run "${layer[@]}" --dispatch all --check --repeat 1 --quiet 2>&1)
  rc=$?
  moved=$(( $(link_bytes 0) + $(link_bytes 1) - before ))
  pass=$(grep -c "vs reference.*PASS" <<<"$out")
  order=$(sed -n 's/^ring order (planned): //p' <<<"$out")
  if [ $rc -eq 0 ] && [ "$pass" -eq 5 ] && [ "$order" = "$planned_order" ] && [ "$moved" -gt 100000 ]; then
    ok "$map: ring, token, a2a, a2a-megatron and a2a-deepep --check PASS across 2 hosts on the ring $order; $((moved / 1024)) KiB over the hosts' links"
  else
    bad "$map: relaymoe run --check (exit $rc, $pass of 5 PASS, ring '$order' vs plan '$planned_order', $moved bytes over the links)"
    echo "$out"
  fi
done

# 3. the ring in rank order, interleaved: every edge between hosts
out=$(mpirun_ 300 --map-by node "$app" run "${layer[@]}" --dispatch ring --ring-order rank --check --repeat 1 --quiet 2>&1)
rc=$?
if [ $rc -eq 0 ] && grep -q "^ring order (rank): 0 1 2 3" <<<"$out" && grep -q "check ring vs reference.*PASS" <<<"$out"; then
  ok "node: --ring-order rank (ring 0 1 2 3, every edge between hosts) --check PASS"
else
  bad "node: --ring-order rank (exit $rc)"; echo "$out"
fi

echo "test_across_hosts: $fails failure(s)"
[ $fails -eq 0 ]
