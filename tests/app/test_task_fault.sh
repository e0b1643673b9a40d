#!/usr/bin/env bash
# relaymoe run when a task fails inside a pass (RMOE_FAULT_TASK: the named
# task sees its first buffer one element short and fails its own size
# check): a non-zero exit, no hang, every rank naming the task, and no
# output directory. For each dispatcher, a forward task on rank 0 (the
# router's, before the counts that every rank's graph depends on) and a
# backward task of the dispatch on rank 1.
#   test_task_fault.sh RELAYMOE MPIEXEC WORK_DIR
set -uo pipefail
app=$1 mpiexec=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fails=0
small=(--hidden 32 --ffn 16 --experts 8 --topk 2 --tokens 40 --repeat 1 --quiet)
# dispatcher, then a backward task of its dispatch graph as traces name it
cases=("ring:expert-bwd h1" "token:expert-bwd h1" "a2a:expert-bwd" "a2a-megatron:expert-bwd" "a2a-deepep:expert-bwd")
for c in "${cases[@]}"; do
  d=${c%%:*} bwd=${c#*:}
  for fault in "router-fwd@0" "$bwd@1"; do
    task=${fault%@*} rank=${fault##*@}
    out="$work/out-$d"
    log=$(RMOE_FAULT_TASK="$fault" timeout 120 "$mpiexec" -n 2 --oversubscribe "$app" run --dispatch "$d" \
          "${small[@]}" --dump "$out" 2>&1); rc=$?
    why=""
    [ $rc -eq 0 ] && why="exit 0"
    [ $rc -eq 124 ] && why="hung (timeout)"
    for r in 0 1; do
      grep -q "rank $r: .*rank $rank: task $task failed" <<<"$log" || why="$why; rank $r does not name task '$task' of rank $rank"
    done
    [ -e "$out" ] && why="$why; $out was written"
    if [ -z "$why" ]; then echo "ok: $d, $task failing on rank $rank: exit $rc, named on both ranks, nothing written"
    else echo "FAIL: $d, $task on rank $rank: ${why#; }"; echo "$log" | tail -20; fails=$((fails + 1)); fi
  done
done
[ $fails -eq 0 ] && echo "test_task_fault: passed" || echo "test_task_fault: $fails failure(s)"
exit $((fails > 0))
