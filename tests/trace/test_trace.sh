#!/usr/bin/env bash
# Traces end to end, on a build against a StarPU with FxT: a 2-rank run of
# every dispatcher records and converts a trace; it names the method's tasks
# and the transfers of every hop (check_trace.py); the overlap summary and a
# non-empty Gantt PNG come out of it; the striped rings' pieces decode by
# leg at 4 ranks in 2 emulated nodes; a trace folder that cannot be created
# is an error on every rank.
# With "nofxt" (a build against a StarPU without FxT): --trace is refused
# with a message that says how to get FxT.
#   test_trace.sh RELAYMOE MPIEXEC SOURCE_DIR WORK_DIR [nofxt]
set -uo pipefail
app=$1 mpiexec=$2 src=$3 work=$4 mode=${5:-fxt}
py=/usr/bin/python3
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
rm -rf "$work"
mkdir -p "$work"
run() { timeout 240 "$mpiexec" -n "$1" --oversubscribe "$app" run --repeat 1 --tokens 256 "${@:2}"; }

if [ "$mode" = nofxt ]; then
  out=$(run 1 --dispatch ring --trace "$work/trace" 2>&1); rc=$?
  if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q "no FxT.*build-starpu.sh --fxt"; then
    ok "--trace without FxT refused: $(printf '%s' "$out" | grep -m1 FxT)"
  else
    bad "--trace without FxT (rc=$rc)"; echo "$out"
  fi
  [ $fails -eq 0 ] && exit 0 || exit 1
fi

if ! [ -x $py ] || ! $py -c 'import matplotlib' 2>/dev/null; then echo "python3-matplotlib missing"; exit 77; fi

# 1. Record and convert.
out=$(run 2 --dispatch all --trace "$work/trace" 2>&1); rc=$?
if [ $rc -eq 0 ] && printf '%s' "$out" | grep -q "trace of 2 rank(s) in"; then
  ok "relaymoe run --dispatch all --trace on 2 ranks"
else
  bad "relaymoe run --trace (rc=$rc)"; echo "$out"
fi
for f in prof_file_0 prof_file_1 paje.trace tasks.rec dag.dot relaymoe-trace.txt; do
  [ -s "$work/trace/$f" ] || bad "$f missing or empty"
done

# 2. Tasks and transfers of every hop, by name.
if chk=$($py "$src/tests/trace/check_trace.py" "$work/trace" 2 2>&1); then
  ok "names of every hop's tasks and transfers:"; echo "$chk"
else
  bad "trace names"; echo "$chk"
fi

# 3. Overlap summary, named links, Gantt chart.
if rep=$("$src/scripts/trace/report.sh" "$work/trace" trace-np2 2>&1); then
  summary=$(printf '%s\n' "$rep" | grep '^overlap trace-np2: ranks 2, passes 8' || true)
  if [ -n "$summary" ]; then ok "$summary"; else bad "overlap summary"; echo "$rep"; fi
else
  bad "report.sh"; echo "$rep"
fi
grep -q $'\tMPIL\t.*"weights h0 (tag' "$work/trace/paje.trace" && ok "paje.trace links named by hop" ||
  bad "paje.trace links not named"
png=$work/trace/gantt.png
if [ -f "$png" ] && [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] &&
   [ "$(stat -c %s "$png")" -gt 20000 ]; then
  ok "gantt.png: $(stat -c %s "$png") bytes"
else
  bad "gantt.png missing, not a PNG or too small"
fi

# 4. The striped rings: 4 ranks in 2 emulated nodes, so each node-crossing
# hop goes in 2 pieces through relays (graph/pass/stripes.c). Every pass
# takes its STRIPE_LEGS tag blocks, no transfer is left without its pass,
# each pass has pieces across the nodes, and the names check as at 2 ranks.
out=$(run 4 --dispatch ring,token --ranks-per-node 2 --trace "$work/striped" 2>&1); rc=$?
if [ $rc -eq 0 ] && chk=$($py "$src/tests/trace/check_trace.py" "$work/striped" 4 2>&1) &&
   legs=$($py - "$src/scripts/trace" "$work/striped" <<'EOF'
import sys
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])
import rmoe_trace
t = rmoe_trace.Trace(sys.argv[2])
assert len(t.passes) == 8, [p.label for p in t.passes]
for p in t.passes:
    assert len(p.blocks) == rmoe_trace.STRIPE_LEGS, (p.label, p.blocks)
    assert any(x.leg == 2 and x.pass_index == p.index for x in t.transfers), p.label
orphans = [x.label for x in t.transfers if x.pass_index is None]
assert not orphans, orphans[:5]
print(sum(1 for x in t.transfers if x.leg == 2), "in all")
EOF
); then
  ok "striped rings on 4 ranks (2 a node): 8 passes, each with its tag blocks and pieces across the nodes ($legs)"
else
  bad "striped rings' trace (rc=$rc)"; echo "$out"; echo "${chk:-}"; echo "${legs:-}"
fi

# 5. A trace folder that cannot be created: refused on every rank, no hang.
touch "$work/not-a-folder"
out=$(run 2 --dispatch ring --trace "$work/not-a-folder/trace" 2>&1); rc=$?
if [ $rc -ne 0 ] && [ "$(printf '%s' "$out" | grep -c "cannot create the folder\|another rank failed to set up the trace")" -ge 2 ]; then
  ok "unwritable trace folder refused on both ranks"
else
  bad "unwritable trace folder (rc=$rc)"; echo "$out"
fi

[ $fails -eq 0 ] && exit 0 || exit 1
