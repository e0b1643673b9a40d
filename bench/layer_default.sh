#!/usr/bin/env bash
# The default layer (Qwen3-30B-A3B with H, F, tokens divided by 16) at N = 2
# and 4 ranks, the ring and every all-to-all baseline (a2a, pipelined per peer
# and chunk with the ring's kernel discipline; a2a-megatron, Megatron Core
# 0.13's alltoall dispatcher; a2a-deepep, DeepEP's normal-mode dispatch, a
# token once per destination rank) side by side,
# their repetitions interleaved in one process; writes
# bench/results/layer_default.csv and layer_default.md.
#   bench/layer_default.sh [extra relaymoe run options]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
app=$here/build/apps/relaymoe
out=$here/bench/results
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export STARPU_HOME=${STARPU_HOME:-$here/build/starpu-home}
mkdir -p "$STARPU_HOME"
: > "$tmp/log"
# --window 2: the all-to-alls at their leanest in memory, two blocks in
# flight per role (by default every peer's, their fastest: rmoe_a2a_depth);
# the rings' default.
for np in 2 4; do
  echo "== $np ranks" | tee -a "$tmp/log"
  "$here/scripts/mpirun.sh" -np $np "$app" run --repeat 5 --window 2 --quiet --csv "$tmp/layer_default.csv" "$@" |
    tee -a "$tmp/log"
done
mv "$tmp/layer_default.csv" "$out/layer_default.csv"
{
  echo "# Default layer, ring vs the three all-to-all baselines"
  echo
  echo "Command: \`bench/layer_default.sh $*\` on $(date -u +%Y-%m-%d), $(nproc) cores ($(uname -m)), CPU only, ranks oversubscribed."
  echo "Layer: Qwen3-30B-A3B with H, F and tokens divided by 16 (H=128, F=48, E=128, K=8, 3072 tokens per rank), fp32."
  echo "Times: medians of 5 repetitions after a warm-up, max over ranks; the dispatchers alternate repetition by repetition (the order rotating), and the ratios are the median and range of the per-repetition ratios. Memory, max over ranks: peak = the layer's StarPU data (resident + StarPU temporaries, sampled at every task and while exchanges are in flight); heap = the independent figure (resident + the process heap's growth over the pass: every allocation, StarPU's, codelet scratch, Open MPI's staging); TOTAL = the headline metric, the larger of the two over both passes, the only one the ratios are given in (docs/memory.md), the execution peak and each figure's own ratio being labelled diagnostics. a2a is the all-to-all with the ring's kernel discipline, a2a-megatron Megatron Core 0.13's alltoall dispatcher (the paper's baseline), a2a-deepep DeepEP's normal-mode dispatch (each token sent once to each rank owning one of its experts, its outputs reduced there before one row goes back); the strongest baseline is the one with the smallest figure."
  echo "These are CPU ranks oversubscribed on $(nproc) shared cores: the ratios are side by side on this machine, not GPU times."
  echo
  echo '```'
  cat "$tmp/log"
  echo '```'
  echo
  echo "Raw rows: layer_default.csv."
} > "$out/layer_default.md"
echo "wrote $out/layer_default.csv and $out/layer_default.md"
