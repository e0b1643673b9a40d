#!/usr/bin/env bash
# Everything scripts/trace/ makes of a trace folder (relaymoe run --trace DIR):
#   DIR/paje.trace     its MPI links named by what they carry and their hop
#   DIR/overlap.txt    per pass, hop and rank: transfer, hidden and compute
#                      time (overlap.py), the summary line last (also printed)
#   DIR/overlap.csv    the same rows
#   DIR/gantt.png      the Gantt chart (gantt.py; GANTT_PASSES=A-B to zoom)
#   DIR/paje.svg       ViTE's picture, when vite is installed
#   scripts/trace/report.sh DIR [LABEL]
set -euo pipefail
dir=${1:?usage: report.sh DIR [LABEL]}
label=${2:-$(basename "$dir")}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
$py "$here/rmoe_trace.py" name "$dir" >/dev/null
rm -f "$dir/overlap.csv"
$py "$here/overlap.py" "$dir" --label "$label" --csv "$dir/overlap.csv" >"$dir/overlap.txt"
tail -n 1 "$dir/overlap.txt"
$py "$here/gantt.py" "$dir" -o "$dir/gantt.png" ${GANTT_PASSES:+--passes "$GANTT_PASSES"} >/dev/null
echo "gantt: $dir/gantt.png"
if command -v vite >/dev/null 2>&1; then
  # ViTE exports SVG only, needs a Qt platform even without a display, and
  # writes its parse log (log.txt) where it runs.
  if (cd "$dir" && QT_QPA_PLATFORM=offscreen timeout 120 vite -f paje.trace -e paje.svg >/dev/null 2>&1); then
    echo "vite: $dir/paje.svg"
  else
    echo "vite: export failed (optional)"
  fi
fi
