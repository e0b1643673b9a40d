#!/usr/bin/env bash
# Training exactness (paper §4.5, Fig. 18, in miniature): the same model from
# the same seed trained with --dispatch ring and with --dispatch a2a; writes
# both loss curves, their plot with the relative difference against the fp32
# rounding bound s * 2^-24, and a Markdown summary into bench/results/. A
# control run (the ring with a learning rate 1e-4 off) shows what a real,
# tiny difference of the computation looks like against the same bound.
# Exit status: bench/train_compare.py's (0: within the bound and the loss falls).
#   bench/train_exactness.sh [BUILD_DIR] [RANKS] [STEPS]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
np=${2:-4}
steps=${3:-300}
out=$src/bench/results
mkdir -p "$out"
export STARPU_HOME=${STARPU_HOME:-$build/starpu-home}
mkdir -p "$STARPU_HOME"
args=(--layers 2 --hidden 64 --ffn 32 --experts 8 --topk 2 --vocab 128 --tokens 256 --shared-ffn 32
      --seed 1 --print-every 50)
# One rank first: StarPU calibrates a fresh STARPU_HOME, which ranks starting
# together would race on.
(cd "$src" && scripts/mpirun.sh -np 1 "$build/apps/relaymoe" train --steps 0 --quiet > /dev/null)
cmds=()
for d in ring a2a; do
  cmd=(scripts/mpirun.sh -np "$np" "$build/apps/relaymoe" train "${args[@]}" --steps "$steps" --dispatch $d
       --csv "$out/train_exactness_$d.csv")
  cmds+=("${cmd[*]}")
  (cd "$src" && "${cmd[@]}")
done
# Control: the ring with the learning rate changed by 1e-4 relatively, for a
# sixth of the steps: a real (tiny) difference of the computation.
control_steps=$(( steps / 6 > 20 ? steps / 6 : 20 ))
ctl=(scripts/mpirun.sh -np "$np" "$build/apps/relaymoe" train "${args[@]}" --dispatch ring --lr 0.0030003
     --steps "$control_steps" --csv "$out/train_exactness_control.csv")
(cd "$src" && "${ctl[@]}")
/usr/bin/python3 "$src/bench/train_plot.py" --out "$out/train_exactness.png" --labels "ring,a2a,ring lr+1e-4" \
  --title "relaymoe train, $np ranks: ring vs all-to-all" \
  "$out/train_exactness_ring.csv" "$out/train_exactness_a2a.csv" "$out/train_exactness_control.csv"
machine="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
shown() { sed -e "s|$build/|BUILD/|g" -e "s|$src/||g" <<<"$1"; }
/usr/bin/python3 "$src/bench/train_compare.py" "$out/train_exactness_ring.csv" "$out/train_exactness_a2a.csv" \
  --control "$out/train_exactness_control.csv" --control-what "--lr 0.0030003 instead of 0.003 (1e-4 relative)" \
  --summary "$out/train_exactness.md" --png train_exactness.png \
  --command "bench/train_exactness.sh BUILD $np $steps   # BUILD: the build directory; on $machine. It runs: $(shown "${cmds[0]}"); $(shown "${cmds[1]}"); $(shown "${ctl[*]}")"
