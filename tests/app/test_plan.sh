#!/usr/bin/env bash
# relaymoe plan end to end: the JSON plan of Qwen3-30B-A3B on 8 simulated
# MareNostrum 5 ranks parses and says what the planner decides, with every
# dispatcher's time bound and its fit under a cap; text output;
# the live topology under mpiexec; and bad input (exit 2, nothing on stdout,
# the message names the problem).
#   test_plan.sh RELAYMOE MPIEXEC SOURCE_DIR
set -uo pipefail
app=$1 mpiexec=$2 src=$3
py=/usr/bin/python3
[ -x $py ] || { echo "python3 missing"; exit 77; }
mn5=$src/scheduler/clusters/mn5-acc.cluster
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# 1. JSON, as one process (MPI singleton): valid, and the decisions in it.
json=$(timeout 60 "$app" plan --preset Qwen3-30B-A3B --cluster "$mn5" --ranks 8 --json); rc=$?
chk=$(printf '%s' "$json" | $py -c '
import json, sys
p = json.load(sys.stdin)
assert p["ranks"] == 8 and p["tokens_per_rank"] == 49152, p
assert p["model"]["hidden"] == 2048 and p["model"]["experts"] == 128
assert p["cluster"]["name"] == "mn5-acc" and p["cluster"]["nodes"] == 2
ring = p["ring"]
assert sorted(ring["order"]) == list(range(8)) and ring["node_crossings"] == 2
assert [e["link"] for e in ring["edges"]].count("network") == 2
h = p["hops"]
assert h["expert"]["forward"]["bytes"] == 16 * 3 * 2048 * 768 * 2
assert h["token"]["forward"]["bytes"] == 49152 * (2 * 2048 * 2 + 8 * 8)
assert h["expert"]["backward"]["bytes"] == 2 * h["expert"]["forward"]["bytes"]
assert p["choice"]["mode"] == "expert" and p["choice"]["crossover_tokens"] == 21947
assert 0 <= p["overlap"]["forward_hidden_fraction"] <= 1
assert p["memory"]["modelled"] is True
m = p["memory"]["dispatchers"]
# each dispatcher modelled; the one with the smaller peak trains at least as
# many tokens (which one that is, the benchmarks report)
assert all(m[d]["peak_backward_bytes"] > 0 and m[d]["largest_trainable_tokens"] > 0 for d in ("ring", "a2a"))
lo, hi = sorted(("ring", "a2a"), key=lambda d: m[d]["peak_backward_bytes"])
assert m[lo]["largest_trainable_tokens"] >= m[hi]["largest_trainable_tokens"], (lo, hi)
# the time bound of every dispatcher the memory model has (scheduler/rmoe_time_bound.h)
tb = p["time_bound"]
assert tb["error"] is None and tb["device_tflops"] == 400 and tb["task_floors"] is False, tb
assert set(tb["dispatchers"]) == set(m) == {"ring", "token", "a2a", "a2a-megatron", "a2a-deepep"}
for d, b in tb["dispatchers"].items():
    for ps in ("forward", "backward"):
        q = b[ps]
        assert q["bytes"] > 0 and q["flops"] > 0 and q["wire_ms"] > 0 and q["compute_ms"] > 0, (d, q)
        assert q["link"] == "network", (d, q)  # 8 ranks span two nodes
    assert abs(b["wire_ms"] - b["forward"]["wire_ms"] - b["backward"]["wire_ms"]) <= 1e-4 * b["wire_ms"], d
    assert abs(b["bound_ms"] - max(b["compute_ms"], b["wire_ms"])) <= 1e-4 * b["bound_ms"], d
    assert abs(b["serial_ms"] - b["compute_ms"] - b["wire_ms"]) <= 1e-4 * b["serial_ms"], d
    peak = max(m[d]["peak_forward_bytes"], m[d]["peak_backward_bytes"])
    assert b["fits_device"] is (peak <= p["cluster"]["device_memory_bytes"]), d
    assert b["fits_mem_cap"] is None, d
# the ring sends EP-1 hops of a partition forward (Table 2), every dispatcher computes the same
ring = tb["dispatchers"]["ring"]
assert ring["forward"]["bytes"] == 7 * h["expert"]["forward"]["bytes"]
assert len({b["compute_ms"] for b in tb["dispatchers"].values()}) == 1
print("choice", p["choice"]["mode"], "crossover", p["choice"]["crossover_tokens"], "ring bound %.1f ms" % ring["bound_ms"])
' 2>&1); crc=$?
if [ $rc -eq 0 ] && printf '%s' "$json" | $py -m json.tool >/dev/null && [ $crc -eq 0 ]; then
  ok "plan --json: $chk"; else bad "plan --json (rc=$rc, check $crc)"; echo "$json"; echo "$chk"; fi

# 1b. Under a memory cap every dispatcher's bound says whether it fits it:
#     one that takes a cap by chunking, one that takes none by its peak.
json=$(timeout 60 "$app" plan --preset Qwen3-30B-A3B --cluster "$mn5" --ranks 8 --mem-cap 4G --json); rc=$?
chk=$(printf '%s' "$json" | $py -c '
import json, sys
p = json.load(sys.stdin)
cap, tb, m = p["memory"]["mem_cap"], p["time_bound"]["dispatchers"], p["memory"]["dispatchers"]
for d, b in tb.items():
    c, peak = cap["dispatchers"][d], max(m[d]["peak_forward_bytes"], m[d]["peak_backward_bytes"])
    fits = c["error"] is None or (c["error"] == "takes no cap" and peak <= cap["bytes"])
    assert b["fits_mem_cap"] is fits, (d, b["fits_mem_cap"], c)
print("fits 4 GiB:", " ".join(d for d, b in tb.items() if b["fits_mem_cap"]))
' 2>&1); crc=$?
if [ $rc -eq 0 ] && [ $crc -eq 0 ]; then ok "plan --mem-cap: $chk"
else bad "plan --mem-cap (rc=$rc, check $crc)"; echo "$chk"; fi

# 2. Text: the ring, both modes, the choice, the time bounds.
out=$(timeout 60 "$app" plan --preset MoE-E384 --ffn 2048 --cluster "$mn5" --ranks 8 --seq 20480 \
      --micro-batch 12 --sp 2 --cp 4 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q "choice: token routing" <<<"$out" && grep -q "30720 tokens per rank" <<<"$out" \
   && grep -q "network" <<<"$out" && grep -q "^time bound per rank" <<<"$out" \
   && [ "$(grep -cE '^  (ring|token|a2a|a2a-megatron|a2a-deepep) +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ ' <<<"$out")" -ge 5 ]
then ok "plan text (E384, F2048, short sequence: token routing; time bounds)"
else bad "plan text (rc=$rc)"; echo "$out"; fi

# 3. The live topology under mpiexec: every rank on this machine, one node.
json=$(timeout 120 "$mpiexec" -n 2 --oversubscribe "$app" plan --experts 8 --json); rc=$?
chk=$(printf '%s' "$json" | $py -c '
import json, sys
p = json.load(sys.stdin)
assert p["ranks"] == 2 and p["cluster"]["live"] is True and p["cluster"]["nodes"] == 1, p
assert p["ring"]["node_crossings"] == 0 and sorted(p["ring"]["order"]) == [0, 1]
print("live ring", p["ring"]["order"])
' 2>&1); crc=$?
if [ $rc -eq 0 ] && [ $crc -eq 0 ]; then ok "plan under mpiexec: $chk"
else bad "plan under mpiexec (rc=$rc, check $crc)"; echo "$json"; echo "$chk"; fi

# 4. Bad input: exit 2, stdout empty, a message naming the problem.
expect_fail() { # NAME PATTERN ARGS...
  local name=$1 pat=$2; shift 2
  local out err rc
  err=$(mktemp)
  out=$(timeout 60 "$app" plan "$@" 2>"$err"); rc=$?
  if [ $rc -eq 2 ] && [ -z "$out" ] && grep -q -- "$pat" "$err"; then ok "$name: exit 2"
  else bad "$name (rc=$rc, wanted 2, empty stdout and '$pat')"; echo "$out"; cat "$err"; fi
  rm -f "$err"
}
bad_cluster=$(mktemp)
printf 'name = x\nnodes = 2\nbogus = 1\n' >"$bad_cluster"
expect_fail "unknown option" "did you mean --ranks" --rank 8 --json
expect_fail "experts not divisible" "not divisible by EP = 3" --ranks 3 --json
expect_fail "bad dtype" "--dtype 'f16'" --dtype f16
expect_fail "tokens and seq" "both given" --tokens 5 --seq 9 --json
expect_fail "seq not divisible" "not divisible by SP\*CP" --seq 1001 --sp 2 --json
expect_fail "bad cluster line" "line 3: key 'bogus'" --cluster "$bad_cluster" --ranks 2 --json
expect_fail "missing cluster" "cannot open" --cluster /nonexistent.cluster --json
expect_fail "too many ranks" "do not fit" --cluster "$src/scheduler/clusters/dgx-h100.cluster" --ranks 16
rm -f "$bad_cluster"

# 5. Selective attention recomputation (§3.4): each dispatcher's MoE peak
#    leaves a budget for kept attention activations; the layers retained
#    fill it (no more than it holds) and grow with it. Which dispatcher
#    keeps more is the benchmark's to report.
json=$(timeout 60 "$app" plan --preset Qwen3-30B-A3B --cluster "$mn5" --ranks 8 --seq 65536 \
       --micro-batch 5 --sp 2 --cp 4 --dp 4 --attention --json); rc=$?
chk=$(printf '%s' "$json" | $py -c '
import json, sys
a = json.load(sys.stdin)["attention"]
r, x = a["ring"], a["a2a"]
for d in (r, x):
    assert 0 < d["retained_layers"] <= d["layers"] == 48, d["retained_layers"]
    assert d["used_bytes"] <= d["budget_bytes"], (d["used_bytes"], d["budget_bytes"])
    # the budget is what the MoE peak leaves of the same device
    assert d["budget_bytes"] + d["peak_full_bytes"] == r["budget_bytes"] + r["peak_full_bytes"]
lo, hi = sorted((r, x), key=lambda d: d["budget_bytes"])
assert lo["retained_layers"] <= hi["retained_layers"], (lo["retained_layers"], hi["retained_layers"])
print("ring", r["retained_layers"], "a2a", x["retained_layers"])' 2>&1); crc=$?
if [ $rc -eq 0 ] && [ $crc -eq 0 ]; then ok "plan --attention: retained layers $chk"
else bad "plan --attention (rc=$rc, check $crc)"; echo "$chk"; fi

echo "test_plan: $fails failure(s)"
[ $fails -eq 0 ]
