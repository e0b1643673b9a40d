#!/usr/bin/env bash
# One rank killed (SIGKILL) in the middle of a run: every process must end,
# with a non-zero status, within BOUND seconds of the kill.
#  1. relaymoe run on 3 ranks under mpirun as it is: Open MPI's default ends
#     the whole job when one rank dies.
#  2. test_hardening kill on 3 ranks under mpirun --enable-recovery, which
#     leaves the survivors running, as a launcher that does not end the job
#     would: the layer's wait_timeout (5 s) brings each survivor back with
#     RMOE_EPEER, and each ends itself.
#  3. The same with the all-to-all, whose exchanges no host wait sees: each
#     survivor's message names the dead rank, from the transfers its pass
#     watched (or from the vote that opens the next pass).
#   test_kill_rank.sh RELAYMOE TEST_HARDENING MPIEXEC
set -uo pipefail
app=$1 prog=$2 mpiexec=$3
bound=${RMOE_KILL_BOUND:-60}
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
"$mpiexec" --version 2>&1 | grep -qE "Open ?MPI|OpenRTE" || { echo "not Open MPI: --enable-recovery unknown"; exit 77; }
work=$(mktemp -d)
mpi=
cleanup() {
  [ -n "$mpi" ] && kill -KILL "$mpi" $(pgrep -P "$mpi") 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Waits up to $bound s after $2 (a time) for mpirun ($1) to end; sets
# status (its exit status, or "hung") and took.
wait_bounded() {
  local pid=$1 since=$2
  status=hung
  while awk -v a="$since" -v b="$(now)" -v n="$bound" 'BEGIN { exit !(b - a < n) }'; do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      status=$?
      break
    fi
    sleep 0.2
  done
  took=$(elapsed "$since")
}

# Processes among $@ still there (zombies count as ended), after waiting
# until the bound for them to go.
alive_after() {
  local since=$1 n=0
  shift
  while :; do
    n=0
    for p in "$@"; do
      st=$(awk '/^State:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
      [ -n "$st" ] && [ "$st" != Z ] && n=$((n + 1))
    done
    [ $n -eq 0 ] && break
    awk -v a="$since" -v b="$(now)" -v m="$bound" 'BEGIN { exit !(b - a < m) }' || break
    sleep 0.2
  done
  echo $n
}

# Waits until file $1 has a line matching $2 (at most 120 s).
wait_for_line() {
  for _ in $(seq 1 1200); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# ---- 1. relaymoe run, mpirun's default --------------------------------------
"$mpiexec" -n 3 --oversubscribe "$app" run --hidden 128 --ffn 64 --experts 12 --topk 4 --tokens 2048 \
  --repeat 1000 > "$work/run.log" 2>&1 &
mpi=$!
if wait_for_line "$work/run.log" "run: forward"; then
  ranks=$(pgrep -P "$mpi")
  victim=$(sed -n 2p <<<"$ranks")
  sleep 1
  kill -KILL "$victim"
  killed=$(now)
  wait_bounded "$mpi" "$killed"
  mpi=
  # shellcheck disable=SC2086
  alive=$(alive_after "$killed" $ranks)
  took=$(elapsed "$killed")
  if [ "$status" != hung ] && [ "$status" -ne 0 ] && [ $alive -eq 0 ]; then
    ok "relaymoe run, rank 1 of 3 killed mid-run: mpirun exit $status, all $(wc -w <<<"$ranks") ranks gone ${took} s after the kill"
  else
    bad "relaymoe run, one rank killed: mpirun status $status after ${took} s, $alive rank(s) still alive"
    cat "$work/run.log"
  fi
else
  bad "relaymoe run never reached its passes"; cat "$work/run.log"
fi
# The other ranks ended by mpirun: none may be left behind.
for p in ${ranks:-}; do kill -KILL "$p" 2>/dev/null; done

# survivors NAME WHAT PATTERN LOG ARGS...: test_hardening kill ARGS on 3
# ranks under --enable-recovery (rank 2 dies), each rank's exit status
# recorded by a shell around it in LOG (mpirun reports 0 under
# --enable-recovery whatever its processes did). Passes when mpirun ends
# within the bound, both survivors' "RMOE_EPEER after" lines match PATTERN,
# and all 3 ranks end non-zero; WHAT says what PATTERN requires.
survivors() {
  local name=$1 what=$2 pat=$3 log=$4
  shift 4
  "$mpiexec" -n 3 --oversubscribe --enable-recovery sh -c \
    '"$0" kill "$@"; echo "exit status of rank $OMPI_COMM_WORLD_RANK: $?"' "$prog" "$@" > "$log" 2>&1 &
  mpi=$!
  if ! wait_for_line "$log" "dying (SIGKILL)"; then
    bad "test_hardening kill $*: no rank died"; cat "$log"
    return
  fi
  killed=$(now)
  wait_bounded "$mpi" "$killed"
  [ "$status" == hung ] && kill -KILL "$mpi" $(pgrep -P "$mpi") 2>/dev/null
  mpi=
  local epeer nonzero
  epeer=$(grep "RMOE_EPEER after" "$log" | grep -c -- "$pat")
  nonzero=$(grep -cE "exit status of rank [0-9]+: [1-9]" "$log")
  if [ "$status" != hung ] && [ "$epeer" -eq 2 ] && [ "$nonzero" -eq 3 ]; then
    ok "$name, rank 2 of 3 killed mid-pass: both survivors returned RMOE_EPEER$what; all 3 processes ended non-zero, the last ${took} s after the kill"
    grep -E "RMOE_EPEER after|exit status of rank" "$log" | sed 's/^/    /'
  else
    bad "$name: mpirun $status after ${took} s, $epeer of 2 survivors returned RMOE_EPEER$what, $nonzero of 3 ranks ended non-zero"
    cat "$log"
  fi
}

# ---- 2. the library's wait_timeout, a launcher that leaves survivors -----------
survivors "wait_timeout 5 s under --enable-recovery" "" "" "$work/kill.log" 5 1.5

# ---- 3. the same, all-to-all ---------------------------------------------------
survivors "all-to-all, wait_timeout 5 s" " naming rank 2" "waiting for .*rank 2 on host" "$work/kill-a2a.log" \
  5 1.5 a2a

echo "test_kill_rank: $fails failure(s)"
[ $fails -eq 0 ]
