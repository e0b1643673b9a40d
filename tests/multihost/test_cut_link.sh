#!/usr/bin/env bash
# A host's link cut in the middle of a ring pass (docs/hardening.md, "A
# host cut off"): relaymoe run --dispatch ring on 2 emulated hosts x 2
# ranks, interleaved (ring 0 2 1 3: two edges between the hosts), with
# wait_timeout 5 s (RMOE_WAIT_TIMEOUT), --dump and --csv given; 0.3 s into
# the timed passes host 1's fabric link goes down (its port on the switch:
# `cluster.sh link 1 down`). The launcher talks over the hosts' management
# network, which stays up, as on a cluster whose fabric link fails: the
# ranks must notice the cut themselves.
#
# Within BOUND seconds of the cut (default 15: wait_timeout, counted from
# the start of the wait, the program's grace (the wait timeout), scheduling on a
# loaded machine) every rank
#   - reports RMOE_EPEER naming, with their hosts, the peers it was waiting
#     for: in a ring pass its left neighbour on the ring (the sender of
#     every relay it receives: the lost rank, or one stalled behind it), or,
#     waiting for a credit of the rings' flow control, its right neighbour
#     (the receiver that grants it: graph/pass/flow.c) or, the ring's
#     crossing hops being striped over both hosts' ranks (two a host: two
#     stripes), a relay on the other host that grants its piece's slot
#     (graph/pass/stripes.c); in
#     the vote that starts a pass (a rank that had all its data when the
#     link went down finishes its pass and waits there) the ranks that
#     never reached the vote; and some rank names a rank of the other host;
#   - ends with a non-zero status (3);
# mpirun ends by itself, non-zero, within MPIRUN_BOUND seconds of the cut
# (default 30), and the `timeout` around it does not fire; no --dump
# folder or --csv file exists.
#
# Each rank runs in a session of its own (rank.sh under setsid): when the
# first rank ends, mpirun ends the job (Open MPI's default; --enable-recovery,
# which would leave the others running, hangs mpirun in Open MPI 4.1 with
# two ranks per host on several hosts), and the others must still end by
# themselves for the test to see what each did. The whole is repeated RUNS
# times in a row (default 3), each on fresh hosts.
#   test_cut_link.sh RELAYMOE SOURCE_DIR WORK [RUNS]
# Needs root (network namespaces) and iproute2; exit 77 without them.
set -uo pipefail
app=$1 src=$2 work=$3 runs=${4:-3}
bound=${RMOE_CUT_BOUND:-15}
mpirun_bound=${RMOE_CUT_MPIRUN_BOUND:-30}
wait_timeout=5

if [ -z "${RMOE_CLUSTER_DIR:-}" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "needs root: network namespaces"; exit 77; }
  command -v ip >/dev/null && command -v unshare >/dev/null && command -v setsid >/dev/null ||
    { echo "needs iproute2, unshare and setsid"; exit 77; }
  rm -rf "$work"
  fails=0
  for run in $(seq 1 "$runs"); do
    mkdir -p "$work/run$run"
    echo "== run $run of $runs"
    "$src/scripts/cluster/cluster.sh" run --hosts 2 --ranks 2 -- "$0" "$app" "$src" "$work/run$run" ||
      fails=$((fails + 1))
  done
  echo "test_cut_link: $fails of $runs run(s) failed"
  [ $fails -eq 0 ]
  exit
fi

nranks=$RMOE_CLUSTER_NP
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
later() { awk -v t="$1" -v n="$2" 'BEGIN { exit !(t > n) }'; }
# A process that is gone or a zombie has ended.
alive() { local st; st=$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null); [ -n "$st" ] && [ "$st" != Z ]; }

export RMOE_WAIT_TIMEOUT=$wait_timeout
timeout -k 5 $((mpirun_bound + 60)) "$RMOE_CLUSTER_MPIRUN" --map-by node -x RMOE_WAIT_TIMEOUT \
  setsid -w "$(dirname "$0")/rank.sh" "$work" "$app" run --dispatch ring --hidden 64 --ffn 32 --experts 8 \
  --topk 2 --tokens 96 --repeat 1000 --dump "$work/dump" --csv "$work/out.csv" >"$work/mpirun.log" 2>&1 &
mpi=$!

# The timed passes run once rank 0 has reported the warm-up.
started=
for _ in $(seq 1 3000); do
  grep -q "ring  warm-up" "$work/rank0.log" 2>/dev/null && { started=1; break; }
  kill -0 $mpi 2>/dev/null || break
  sleep 0.02
done
if [ -z "$started" ]; then
  bad "the ring never finished its warm-up"; cat "$work/mpirun.log" "$work"/rank*.log 2>/dev/null
  kill -TERM $mpi 2>/dev/null; wait $mpi
  exit 1
fi
sleep 0.3
pids=()
for r in $(seq 0 $((nranks - 1))); do pids+=("$(cat "$work/rank$r.pid")"); done
"$RMOE_CLUSTER_SCRIPT" link 1 down || { bad "could not cut host 1's link"; exit 1; }
cut=$(now)

# When each rank ends, and when mpirun does.
declare -A ended
mpirun_took=
while :; do
  for r in $(seq 0 $((nranks - 1))); do
    [ -z "${ended[$r]:-}" ] && ! alive "${pids[$r]}" && ended[$r]=$(since "$cut")
  done
  if [ -z "$mpirun_took" ] && ! kill -0 $mpi 2>/dev/null; then
    wait $mpi
    mpirun_status=$?
    mpirun_took=$(since "$cut")
  fi
  [ -n "$mpirun_took" ] && [ ${#ended[@]} -eq "$nranks" ] && break
  awk -v a="$cut" -v b="$(now)" -v n="$((mpirun_bound + 40))" 'BEGIN { exit !(b - a < n) }' || break
  sleep 0.1
done
passes=$(grep -c "ring  run" "$work/rank0.log")

# mpirun: ended by itself, non-zero, in time.
if [ -z "$mpirun_took" ]; then
  bad "mpirun still running $((mpirun_bound + 40)) s after the cut"
  kill -KILL $mpi 2>/dev/null
elif [ "$mpirun_status" -eq 124 ] || [ "$mpirun_status" -eq 137 ]; then
  bad "the timeout around mpirun fired (status $mpirun_status, ${mpirun_took} s after the cut)"
elif [ "$mpirun_status" -eq 0 ] || later "$mpirun_took" "$mpirun_bound"; then
  bad "mpirun exited $mpirun_status ${mpirun_took} s after the cut (expected non-zero within $mpirun_bound s)"
else
  ok "mpirun exited $mpirun_status by itself ${mpirun_took} s after the cut (bound $mpirun_bound s)"
fi

# The ring and each rank's host, from the run's own output.
ring=$(sed -n 's/^ring order (planned): //p' "$work/rank0.log")
[ -n "$ring" ] || bad "no ring order in rank 0's output"
read -r -a pos <<<"$ring"
declare -A host left right
for r in $(seq 0 $((nranks - 1))); do
  # From rank.sh (a rank whose message names no host still has one).
  host[$r]=$(cat "$work/rank$r.host" 2>/dev/null)
done
for i in "${!pos[@]}"; do
  left[${pos[$i]}]=${pos[$(( (i + ${#pos[@]} - 1) % ${#pos[@]} ))]}
  right[${pos[$i]}]=${pos[$(( (i + 1) % ${#pos[@]} ))]}
done

across=0
for r in $(seq 0 $((nranks - 1))); do
  msg=$(grep -m1 "stalled waiting for" "$work/rank$r.log")
  st=$(cat "$work/rank$r.status" 2>/dev/null || echo none)
  # The peers named: "rank N on host H", as many as the message names.
  named=$(sed 's/ this rank (.*//' <<<"$msg" | grep -o "rank [0-9]* on host [^ ,]*" | sed 's/rank \([0-9]*\) on host \(.*\)/\1@\2/')
  wrong=
  for p in $named; do
    q=${p%@*} h=${p#*@}
    [ "$h" = "${host[$q]:-}" ] || wrong="rank $q named on host $h, but it runs on ${host[$q]:-?}"
    [ "$h" != "${host[$r]:-}" ] && across=$((across + 1))
  done
  kind=vote
  grep -q "pass stalled" <<<"$msg" && kind=pass
  # A ring pass waits for its left neighbour's relay, or for the credit its
  # right neighbour grants before the next send (flow control).
  expect_peer=${left[$r]} role="left neighbour"
  grep -q "waiting for a credit" <<<"$msg" && expect_peer=${right[$r]} role="right neighbour (a credit)"
  relay_credit=
  if grep -q "waiting for a credit" <<<"$msg" && [ -n "$named" ] && [ "${named#*@}" != "${host[$r]:-}" ] &&
     [ "$(wc -w <<<"$named")" -eq 1 ]; then
    relay_credit=1
  fi
  if [ $kind = pass ] && [ "$named" != "$expect_peer@${host[$expect_peer]:-}" ] && [ -z "$relay_credit" ]; then
    wrong="a ring pass names '$named', not its $role $expect_peer nor a relay's credit across the link"
  fi
  if [ -z "${ended[$r]:-}" ]; then
    bad "rank $r still running"
  elif [ -z "$named" ] || [ -n "$wrong" ]; then
    bad "rank $r (on ${host[$r]:-?}): ${wrong:-no peer named}: '${msg:-no message}'"
  elif [ "$st" = none ] || [ "$st" = 0 ]; then
    bad "rank $r: exit status $st (expected non-zero, recorded by its shell)"
  elif later "${ended[$r]}" "$bound"; then
    bad "rank $r ended ${ended[$r]} s after the cut (bound $bound s)"
  else
    ok "rank $r on ${host[$r]}: ended ${ended[$r]} s after the cut, status $st; in a $kind, named $(echo $named | sed 's/@/ on /g')"
  fi
done
[ $across -gt 0 ] || bad "no rank named a peer of the other host"

# No partial output.
for f in "$work/dump" "$work/out.csv"; do
  [ -e "$f" ] && bad "$f exists after the failed run"
done
[ $fails -eq 0 ] && ok "cut after $passes timed pass(es): every rank named the peers it waited for and ended within $bound s; no --dump or --csv output"
grep -h "ending this process" "$work"/rank*.log | sed 's/^/    /'
[ $fails -eq 0 ]
