#!/usr/bin/env bash
# Peak memory of the five dispatchers (ring, token, a2a, a2a-megatron, a2a-deepep) on the paper's Table 3 shapes, scaled
# down: every measured point against the analytical memory model, the model's
# predictions at full size, and a PyTorch peer at EP=1 on the same machine.
#
#   bench/memory/run.sh [--quick] [--scale S] [--repeat R] [--build DIR]
#                       [--out DIR] [--no-torch]
#
# Full (default): S=16, R=3; the distinct Table 3 shapes at EP = 2, 4, 8
# (`relaymoe run --dispatch all`), Qwen3-30B-A3B at 0.25x, 0.5x, 2x its tokens
# at EP=4, the peer at EP=1 (3 alternated rounds), into
# bench/results/memory*.{csv,png,md}.
# --quick: S=32, R=1; Qwen3-30B-A3B at EP = 2, 4, MoE-K16 at EP=8 and
# Qwen2-57B-A14B (shared expert) at EP=4,
# into DIR/bench-memory-quick (DIR: the build tree).
# Fails (exit 1) when the model is more than 10% off any measured peak, or
# the PyTorch layer disagrees with relaymoe's dumped outputs.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
quick=0 scale= repeat= build=${RMOE_BUILD:-$here/build} out= torch=1
args=("$@")
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --scale) scale=$2; shift ;;
    --repeat) repeat=$2; shift ;;
    --build) build=$2; shift ;;
    --out) out=$2; shift ;;
    --no-torch) torch=0 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ $quick -eq 1 ]; then
  scale=${scale:-32} repeat=${repeat:-1} out=${out:-$build/bench-memory-quick} rounds=1
else
  scale=${scale:-16} repeat=${repeat:-3} out=${out:-$here/bench/results} rounds=3
fi
build=$(cd "$build" 2>/dev/null && pwd) || { echo "run.sh: no build tree at '$build'" >&2; exit 2; }
app=$build/apps/relaymoe
[ -x "$app" ] || { echo "run.sh: $app missing: build first (scripts/build.sh, or --build DIR)" >&2; exit 2; }
py=/usr/bin/python3
"$py" -c 'import numpy, matplotlib' 2>/dev/null || {
  echo "run.sh: $py needs numpy and matplotlib: run scripts/setup.sh" >&2; exit 2; }

# The peer needs Debian's PyTorch. A full run installs it through setup.sh
# (only what is missing); --quick, run by CTest, never installs anything.
if [ $torch -eq 1 ] && ! "$py" -c 'import torch' 2>/dev/null; then
  if [ $quick -eq 0 ]; then
    echo "run.sh: installing python3-torch for the PyTorch peer"
    RMOE_SETUP_EXTRA="${RMOE_SETUP_EXTRA:-} python3-torch" "$here/scripts/setup.sh" || {
      echo "run.sh: could not install python3-torch: run RMOE_SETUP_EXTRA=python3-torch" \
           "scripts/setup.sh as root, or pass --no-torch" >&2; exit 2; }
  else
    echo "run.sh: PyTorch missing, peer skipped (RMOE_SETUP_EXTRA=python3-torch scripts/setup.sh installs it)"
    torch=0
  fi
fi

mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export STARPU_HOME=${STARPU_HOME:-$build/starpu-home}
mkdir -p "$STARPU_HOME"
start=$(date +%s)

# One `relaymoe run` per point; its rows go to their own CSV, which
# summarize.py labels with the preset, the scale and the token factor.
npoint=0
point() {  # point PRESET RANKS TOKEN_FACTOR DISPATCH [run options]
  local preset=$1 np=$2 factor=$3 dispatch=$4
  shift 4
  local extra=()
  if [ "$factor" != 1 ]; then
    local base
    base=$("$py" -c "print(round(49152 / $scale))")
    extra=(--tokens "$("$py" -c "print(round($base * $factor))")")
  fi
  npoint=$((npoint + 1))
  local csv
  csv=$tmp/$(printf '%03d' $npoint)__${preset}__${np}__${factor}__${dispatch}.csv
  local t0=$SECONDS
  printf '%-16s EP=%-2s tokens x%-4s %-5s ' "$preset" "$np" "$factor" "$dispatch"
  # --window 2: the all-to-alls at their leanest in memory (two blocks in
  # flight per role; by default every peer's: rmoe_a2a_depth), the rings'
  # default.
  if ! "$here/scripts/mpirun.sh" -np "$np" "$app" run --preset "$preset" --scale "$scale" \
      "${extra[@]}" --dispatch "$dispatch" --window 2 --repeat "$repeat" --quiet --csv "$csv" "$@" \
      > "$tmp/point.log" 2>&1; then
    echo "FAILED"; cat "$tmp/point.log" >&2; exit 1
  fi
  echo "$((SECONDS - t0)) s"
}

# MoE-E128, MoE-K8 and MoE-H768 have Qwen3-30B-A3B's shape (Table 3): measured once.
if [ $quick -eq 1 ]; then
  # 8 ranks once, the shape with the most pairs (CI's two cores).
  for np in 2 4; do point Qwen3-30B-A3B $np 1 all; done
  point MoE-K16 8 1 all
  # The one shape with a shared expert: its phase against the dispatch's.
  point Qwen2-57B-A14B 4 1 all
  peers=(Qwen3-30B-A3B)
else
  shapes=(Qwen3-30B-A3B Qwen3.5-35B-A3B Qwen2-57B-A14B MoE-E64 MoE-E384
          MoE-K4 MoE-K12 MoE-K16 MoE-H512 MoE-H2048)
  for preset in "${shapes[@]}"; do
    for np in 2 4 8; do point "$preset" $np 1 all; done
  done
  for factor in 0.25 0.5 2; do point Qwen3-30B-A3B 4 $factor all; done
  peers=(Qwen3-30B-A3B MoE-K16 MoE-H2048)
fi

# EP=1 beside PyTorch: each relaymoe dispatcher in its own process, so each
# peak RSS is that dispatcher's alone; each torch measurement in a fresh one.
# Rounds alternate the implementations so that other load on the machine falls on all.
for round in $(seq "$rounds"); do
  for preset in "${peers[@]}"; do
    # one BLAS thread, as the peer's torch.set_num_threads(1)
    for d in a2a-megatron a2a ring; do point "$preset" 1 1 "$d" --blas-threads 1; done
    [ $torch -eq 1 ] || continue
    read -r h f e k t < <("$py" - "$app" "$preset" "$scale" <<'EOF'
import json, subprocess, sys
app, preset, scale = sys.argv[1:]
m = json.loads(subprocess.run([app, "plan", "--preset", preset, "--scale", scale, "--ranks", "1",
                               "--json"], check=True, capture_output=True, text=True).stdout)
print(m["model"]["hidden"], m["model"]["ffn"], m["model"]["experts"], m["model"]["topk"],
      m["tokens_per_rank"])
EOF
)
    printf '%-16s EP=1  torch            ' "$preset"
    t0=$SECONDS
    "$py" "$here/bench/gpu/torch_moe.py" bench --hidden "$h" --ffn "$f" --experts "$e" \
      --topk "$k" --tokens "$t" --repeat $((repeat + 1)) > "$tmp/torch__${preset}__${round}.json"
    echo "$((SECONDS - t0)) s"
  done
done

# The PyTorch layer against relaymoe's dumped inputs and outputs, each
# dispatcher, 2 ranks, a small layer.
: > "$tmp/check.log"
if [ $torch -eq 1 ]; then
  for d in ring token a2a a2a-megatron a2a-deepep; do
    "$here/scripts/mpirun.sh" -np 2 "$app" run --hidden 32 --ffn 16 --experts 8 --topk 2 --tokens 64 \
      --dispatch "$d" --repeat 1 --quiet --dump "$tmp/dump-$d" > /dev/null
    echo "relaymoe run --dispatch $d (2 ranks, H=32 F=16 E=8 K=2, 64 tokens per rank):" >> "$tmp/check.log"
    "$py" "$here/bench/gpu/torch_moe.py" check "$tmp/dump-$d" --topk 2 >> "$tmp/check.log" || true
  done
fi

cmd="bench/memory/run.sh${args[*]:+ ${args[*]}}"
# The revision the binary was built from, as the build tree names it (not
# the checkout's path: results name no local paths).
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
source_rev=unknown
if [ -n "$src" ] && rev=$(git -C "$src" rev-parse --short HEAD 2>/dev/null); then
  source_rev=$rev
  [ -z "$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null)" ] ||
    source_rev="$source_rev with uncommitted changes"
fi
"$py" "$here/bench/memory/summarize.py" --runs "$tmp" --app "$app" --out "$out" --scale "$scale" \
  --repeat "$repeat" --rounds "$rounds" --start "$start" --command "$cmd" --source "$source_rev" $([ $quick -eq 1 ] && echo --quick)
