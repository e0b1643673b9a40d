#!/usr/bin/env bash
# Presets run their models' routing: `relaymoe plan --preset` and `run
# --preset` print it (Qwen3-30B-A3B renormalised without a shared expert,
# Qwen2-57B-A14B not renormalised with a gated shared expert of 20480, the
# scaling shapes Qwen3-style), and `relaymoe run --preset Qwen2-57B-A14B
# --scale 16 --check` passes on every dispatcher.
#   test_preset_routing.sh RELAYMOE MPIEXEC WORK_DIR
set -uo pipefail
app=$1 mpiexec=$2 work=$3
# shellcheck source=tests/app/checks.sh
. "$(dirname "$0")/checks.sh"

expect_routing() { # NAME WANT ARGS...: plan's routing line
  local name=$1 want=$2 out; shift 2
  out=$(timeout 120 "$app" plan --preset "$name" --ranks 8 "$@" 2>&1)
  if grep -q "^routing: $want\$" <<<"$out"; then ok "plan $name: $want"; else bad "plan $name: wanted '$want'"; echo "$out"; fi
}
expect_routing Qwen3-30B-A3B "top-k renormalised, no shared expert"
expect_routing Qwen2-57B-A14B "top-k not renormalised, gated (Qwen2-MoE) shared expert of 20480"
expect_routing Qwen2-57B-A14B "top-k not renormalised, gated (Qwen2-MoE) shared expert of 1280" --scale 16
expect_routing Qwen3.5-35B-A3B "top-k renormalised, gated (Qwen2-MoE) shared expert of 512"
for p in MoE-E64 MoE-E128 MoE-E384 MoE-K4 MoE-K8 MoE-K12 MoE-K16 MoE-H512 MoE-H768 MoE-H2048; do
  expect_routing $p "top-k renormalised, no shared expert"
done
# An explicit width keeps the model's gate; width 0 drops the shared expert.
expect_routing Qwen2-57B-A14B "top-k not renormalised, gated (Qwen2-MoE) shared expert of 64" --shared-ffn 64 --scale 16
expect_routing Qwen2-57B-A14B "top-k not renormalised, no shared expert" --shared-ffn 0
expect_routing MoE-E64 "top-k renormalised, ungated (DeepSeek-style) shared expert of 64" --shared-ffn 64
expect_routing MoE-E64 "top-k renormalised, gated (Qwen2-MoE) shared expert of 64" --shared-ffn 64 --shared-gated
out=$(timeout 120 "$app" plan --preset Qwen2-57B-A14B --ranks 8 --json 2>&1)
grep -q '"norm_topk": false, "shared_ffn": 20480, "shared_gated": true' <<<"$out" && ok "plan --json routing" \
  || { bad "plan --json routing"; echo "$out" | head -5; }

# The acceptance run: every dispatcher of the default set against the reference.
out=$(timeout 900 "$mpiexec" -n 1 --oversubscribe "$app" run --preset Qwen2-57B-A14B --scale 16 --check --repeat 1 \
      --quiet 2>&1); rc=$?
n=$(grep -c "check .* vs reference.*PASS" <<<"$out")
if [ $rc -eq 0 ] && [ "$n" -eq 4 ] && grep -q "routing: top-k not renormalised, gated (Qwen2-MoE) shared expert of 1280" <<<"$out"
then ok "run --preset Qwen2-57B-A14B --scale 16 --check: $(grep -m1 'check ring' <<<"$out")"
else bad "run --preset Qwen2-57B-A14B --scale 16 --check (rc=$rc, $n passing checks)"; echo "$out"; fi

echo "test_preset_routing: $fails failure(s)"
[ $fails -eq 0 ]
