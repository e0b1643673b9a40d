#!/usr/bin/env bash
# The default layer (Qwen3-30B-A3B with H, F, tokens divided by 16) at N = 2
# and 4 ranks, ring and all-to-all side by side in each run; writes
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
for np in 2 4; do
  echo "== $np ranks" | tee -a "$tmp/log"
  "$here/scripts/mpirun.sh" -np $np "$app" run --repeat 5 --quiet --csv "$tmp/layer_default.csv" "$@" | tee -a "$tmp/log"
done
mv "$tmp/layer_default.csv" "$out/layer_default.csv"
{
  echo "# Default layer, ring vs all-to-all"
  echo
  echo "Command: \`bench/layer_default.sh $*\` on $(date -u +%Y-%m-%d), $(nproc) cores ($(uname -m)), CPU only, ranks oversubscribed."
  echo "Layer: Qwen3-30B-A3B with H, F and tokens divided by 16 (H=128, F=48, E=128, K=8, 3072 tokens per rank), fp32."
  echo "Times are medians of 5 after a warm-up, max over ranks; memory is the layer's data (resident + sampled StarPU temporaries), max over ranks."
  echo
  echo '```'
  cat "$tmp/log"
  echo '```'
  echo
  echo "Raw rows: layer_default.csv."
} > "$out/layer_default.md"
echo "wrote $out/layer_default.csv and $out/layer_default.md"
