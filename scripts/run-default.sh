#!/usr/bin/env bash
# Sets up (Debian packages), builds, and runs the main job on its default
# configuration: `relaymoe run` on 4 ranks (the Qwen3-30B-A3B layer with H and
# F divided by 8), ring and all-to-all side by side, checked against the
# reference. Extra arguments go to `relaymoe run`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/setup.sh"
"$here/scripts/build.sh"
exec "$here/scripts/mpirun.sh" -np "${RMOE_NP:-4}" "$here/build/apps/relaymoe" run --check "$@"
