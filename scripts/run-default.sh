#!/usr/bin/env bash
# Sets up (Debian packages), builds, and runs the main job on its default
# configuration: `relaymoe run --check` on 4 ranks (RMOE_NP), the
# Qwen3-30B-A3B layer with H, F and tokens divided by 16 (H=128, F=48, E=128,
# K=8, 3072 tokens per rank), the ring and the three all-to-all baselines (a2a,
# a2a-megatron, a2a-deepep) side by side, each checked against the reference. Extra
# arguments go to `relaymoe run`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/setup.sh"
"$here/scripts/build.sh"
exec "$here/scripts/mpirun.sh" -np "${RMOE_NP:-4}" "$here/build/apps/relaymoe" run --check "$@"
