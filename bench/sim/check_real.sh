#!/usr/bin/env bash
# Real against simulated, on this machine's CPUs: one small layer run for real
# (build/apps/relaymoe through scripts/mpirun.sh, one StarPU CPU worker per
# rank) and simulated (build-sim/apps/relaymoe under StarPU-SimGrid on the
# --cpu platform of scripts/sim/platform.py, one CPU worker per rank), with the
# simulation's rates calibrated on this machine just before:
#   compute  bench/sim/cpu_rates.c: OpenBLAS sgemm on one core at the layer's
#            expert GEMM shapes -> RMOE_SIM_CPU_GFLOPS; a row gather ->
#            RMOE_SIM_CPU_GBS (codelets/sim_cost.c's roofline)
#   links    bench/hop/hop_bench.c run with the same launcher and rank count:
#            per-hop time of plain MPI and of StarPU-MPI at 64 KB - 4 MB,
#            fitted as latency + bytes / bandwidth
# Two simulations per case:
#   raw         plain MPI's link fit and a dedicated core per rank: what the
#               hardware alone explains
#   calibrated  StarPU-MPI's hop fit (its progress thread, wake-ups and
#               polling on oversubscribed cores become link latency) and the
#               CPU rates times min(1, cores / ranks) (ranks share the cores)
# and the error of each against the real medians, forward and backward.
#
#   bench/sim/check_real.sh [--ranks "2 4"] [--dispatch "ring token a2a"]
#       [--layer "--hidden 128 --ffn 48 --experts 16 --topk 4 --tokens 1024"]
#       [--repeat 5] [--tol 30] [--floor-us 5] [--sched POLICY]
#       [--real-app PATH] [--sim-app PATH] [--prefix /opt/starpu-sim]
#       [--out bench/results] [--keep DIR]
#
# Writes OUT/sim_check.csv, OUT/sim_check.meta.json and rewrites OUT/sim.md.
# Exit 0 when every calibrated simulation is within --tol percent of the real
# run, 1 otherwise (the files are written either way), 2 on bad options.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
ranks="2 4"
dispatches="ring token a2a"
layer="--hidden 128 --ffn 48 --experts 16 --topk 4 --tokens 1024"
repeat=5
tol=30
floor_us=5
sched=
real_app=$root/build/apps/relaymoe
sim_app=$root/build-sim/apps/relaymoe
prefix=/opt/starpu-sim
out=$root/bench/results
keep=
die() { echo "sim/check_real.sh: $*" >&2; exit 2; }
need() { [ "$2" -ge 2 ] || die "$1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) need "$1" $#; ranks=$2; shift 2 ;;
    --dispatch) need "$1" $#; dispatches=$2; shift 2 ;;
    --layer) need "$1" $#; layer=$2; shift 2 ;;
    --repeat) need "$1" $#; repeat=$2; shift 2 ;;
    --tol) need "$1" $#; tol=$2; shift 2 ;;
    --floor-us) need "$1" $#; floor_us=$2; shift 2 ;;
    --sched) need "$1" $#; sched=$2; shift 2 ;;
    --real-app) need "$1" $#; real_app=$2; shift 2 ;;
    --sim-app) need "$1" $#; sim_app=$2; shift 2 ;;
    --prefix) need "$1" $#; prefix=$2; shift 2 ;;
    --out) need "$1" $#; out=$2; shift 2 ;;
    --keep) need "$1" $#; keep=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown option '$1' (--help lists them)" ;;
  esac
done
py=/usr/bin/python3
for n in $ranks; do [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || die "--ranks: '$n' is not a count of at least 2"; done
for d in $dispatches; do case $d in ring|token|a2a) ;; *) die "--dispatch: '$d' is not ring, token or a2a" ;; esac; done
[[ $repeat =~ ^[0-9]+$ ]] && [ "$repeat" -ge 1 ] || die "--repeat: '$repeat' is not a positive integer"
[[ $tol =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--tol: '$tol' is not a percentage"
[[ $floor_us =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--floor-us: '$floor_us' is not a number of microseconds"
# shellcheck disable=SC2206
layer_args=($layer)
get() {  # value of option $1 in the layer arguments
  local i
  for ((i = 0; i < ${#layer_args[@]} - 1; i++)); do
    [ "${layer_args[$i]}" = "$1" ] && { echo "${layer_args[$((i + 1))]}"; return; }
  done
  die "--layer must give $1"
}
H=$(get --hidden) || exit 2
F=$(get --ffn) || exit 2
E=$(get --experts) || exit 2
K=$(get --topk) || exit 2
T=$(get --tokens) || exit 2
[ -x "$real_app" ] || die "no real build at $real_app (scripts/build.sh)"
[ -x "$sim_app" ] || die "no simulation build at $sim_app (cmake -DRMOE_SIMGRID=ON, see README)"
[ -x "$prefix/bin/starpu_smpirun" ] || die "no starpu_smpirun in $prefix/bin (scripts/build-starpu.sh --prefix $prefix --simgrid)"
sched_args=()
[ -n "$sched" ] && sched_args=(--sched "$sched")
cores=$(nproc)
mkdir -p "$out"
if [ -n "$keep" ]; then mkdir -p "$keep"; work=$(cd "$keep" && pwd)
else work=$(mktemp -d /tmp/rmoe-sim-check.XXXXXX); trap 'rm -rf "$work"' EXIT; fi
export STARPU_SILENT=1 OPENBLAS_NUM_THREADS=1
export STARPU_HOME=$work/starpu-home
mkdir -p "$STARPU_HOME"
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1 /proc/loadavg)

echo "sim/check_real.sh: calibrating this machine ($cores cores)"
gcc -O2 -Wall "$root/bench/sim/cpu_rates.c" -o "$work/cpu_rates" $(pkg-config --cflags --libs openblas)
rates=$("$work/cpu_rates" "$H" "$F" "$E" "$K" "$T")
gflops=$(sed 's/.*gflops=\([0-9.]*\).*/\1/' <<<"$rates")
gbs=$(sed 's/.*gbs=\([0-9.]*\).*/\1/' <<<"$rates")
echo "  one core: sgemm $gflops GFLOP/s at the layer's expert GEMMs, row gather $gbs GB/s"
mpicc -O2 -std=gnu11 "$root/bench/hop/hop_bench.c" -o "$work/hop_bench" $(pkg-config --cflags --libs starpumpi-1.3 starpu-1.3)

rows=$work/rows.csv
echo "ranks,dispatch,variant,run_csv,real_csv,status" >"$rows"
links=$work/links.csv
echo "ranks,kind,latency_us,bandwidth_gbs" >"$links"
for n in $ranks; do
  echo "sim/check_real.sh: $n ranks: StarPU-MPI and plain MPI hops (bench/hop/hop_bench.c)"
  "$root/scripts/mpirun.sh" -np "$n" "$work/hop_bench" --sizes 64K,512K,4M --reps 3 --csv "$work/hop-$n.csv" \
    >"$work/hop-$n.log" 2>&1 || { tail -n 5 "$work/hop-$n.log" >&2; die "hop_bench failed on $n ranks"; }
  "$py" - "$work/hop-$n.csv" "$n" >>"$links" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for kind, col in (("mpi", "mpi_ms"), ("starpu", "starpu_ms")):
    xs = [float(r["bytes"]) for r in rows]
    ys = [float(r[col]) * 1e-3 for r in rows]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0
    if slope <= 0:   # noisy: the largest size alone
        slope = max(ys[i] / xs[i] for i in range(n))
    lat = max(0.0, my - slope * mx)
    print("%s,%s,%.3f,%.4f" % (sys.argv[2], kind, lat * 1e6, 1e-9 / slope))
EOF
  grep "^$n," "$links" | awk -F, '{printf "  %s: latency %.1f us, %.3f GB/s\n", $2, $3, $4}'
  for d in $dispatches; do
    real=$work/real-$n-$d.csv
    echo "sim/check_real.sh: $n ranks, $d: real run ($repeat repetitions)"
    "$root/scripts/mpirun.sh" -np "$n" "$real_app" run "${layer_args[@]}" --dispatch "$d" --repeat "$repeat" \
      "${sched_args[@]}" --quiet --csv "$real" >"$work/real-$n-$d.log" 2>&1 ||
      { tail -n 5 "$work/real-$n-$d.log" >&2; die "the real run failed ($n ranks, $d)"; }
    for v in raw calibrated; do
      kind=mpi share=1
      if [ $v = calibrated ]; then
        kind=starpu
        share=$("$py" -c "print(max(1.0, $n / $cores))")
      fi
      IFS=, read -r _ _ lat bw < <(grep "^$n,$kind," "$links")
      plat=$work/plat-$n-$v
      "$py" "$root/scripts/sim/platform.py" --cpu -n "$n" -o "$plat" --shm-gbs "$bw" --shm-lat-us "$lat" \
        --cpu-gflops "$gflops" >/dev/null
      sim=$work/sim-$n-$d-$v.csv
      status=ok
      ( . "$plat/env.sh"
        export RMOE_SIM_CPU_GFLOPS=$("$py" -c "print($gflops / $share)")
        export RMOE_SIM_CPU_GBS=$("$py" -c "print($gbs / $share)")
        export RMOE_SIM_CPU_FLOOR_US=$floor_us
        cd "$work"
        # shellcheck disable=SC2086
        exec timeout --kill-after=10 600 "$prefix/bin/starpu_smpirun" -np "$RMOE_SIM_NP" \
          -platform "$RMOE_SIM_PLATFORM" -hostfile "$RMOE_SIM_HOSTFILE" $RMOE_SIM_CFG \
          "$sim_app" run "${layer_args[@]}" --dispatch "$d" --repeat 1 "${sched_args[@]}" --quiet --csv "$sim"
      ) >"$work/sim-$n-$d-$v.log" 2>&1 || status=failed
      [ "$status" = ok ] && [ ! -s "$sim" ] && status=no-csv
      echo "$n,$d,$v,$sim,$real,$status" >>"$rows"
      if [ "$status" = ok ]; then
        echo "  $v simulation: fwd $(tail -n 1 "$sim" | cut -d, -f9) ms, bwd $(tail -n 1 "$sim" | cut -d, -f10) ms;" \
             "real fwd $(tail -n 1 "$real" | cut -d, -f9) ms, bwd $(tail -n 1 "$real" | cut -d, -f10) ms"
      else
        echo "  $v simulation $status; last lines of its log:" >&2
        grep -v '^\[[0-9.]*\] \./src\|^$' "$work/sim-$n-$d-$v.log" | tail -n 5 | sed 's/^/    /' >&2
      fi
    done
  done
done

load1=$(cut -d' ' -f1 /proc/loadavg)
rc=0
"$py" - "$rows" "$links" "$out" "$tol" "$cores" "$gflops" "$gbs" "$floor_us" "$started" "$layer" "$repeat" "$load0" "$load1" \
  "bench/sim/check_real.sh --ranks \"$ranks\" --dispatch \"$dispatches\" --layer \"$layer\" --repeat $repeat --tol $tol --floor-us $floor_us${sched:+ --sched $sched}" <<'EOF' || rc=$?
import csv, json, sys
rows_p, links_p, out, tol, cores, gflops, gbs, floor_us, date, layer, repeat, load0, load1, cmd = sys.argv[1:]
tol = float(tol) / 100
runs = list(csv.DictReader(open(rows_p)))
links = list(csv.DictReader(open(links_p)))
def last(p):
    try:
        r = list(csv.DictReader(open(p)))
        return r[-1] if r else None
    except OSError:
        return None
table = {}
for r in runs:
    key = (int(r["ranks"]), r["dispatch"])
    e = table.setdefault(key, {"real": last(r["real_csv"])})
    e[r["variant"]] = last(r["run_csv"]) if r["status"] == "ok" else None
order = {"ring": 0, "token": 1, "a2a": 2}
out_rows, all_ok = [], True
for (n, d) in sorted(table, key=lambda k: (k[0], order[k[1]])):
    e = table[(n, d)]
    for ps, col in (("fwd", "fwd_ms"), ("bwd", "bwd_ms")):
        real = float(e["real"][col])
        cal = float(e["calibrated"][col]) if e.get("calibrated") else None
        raw = float(e["raw"][col]) if e.get("raw") else None
        err = cal / real - 1 if cal is not None else None
        raw_err = raw / real - 1 if raw is not None else None
        ok = err is not None and abs(err) <= tol
        all_ok &= ok
        out_rows.append({"ranks": n, "dispatch": d, "pass": ps, "real_ms": "%.3f" % real,
                         "sim_ms": "" if cal is None else "%.3f" % cal,
                         "rel_err": "" if err is None else "%.4f" % err,
                         "within_tol": "yes" if ok else "no",
                         "sim_raw_ms": "" if raw is None else "%.3f" % raw,
                         "rel_err_raw": "" if raw_err is None else "%.4f" % raw_err})
cols = ["ranks", "dispatch", "pass", "real_ms", "sim_ms", "rel_err", "within_tol", "sim_raw_ms", "rel_err_raw"]
with open(out + "/sim_check.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols)
    w.writeheader()
    w.writerows(out_rows)
lk = {}
for l in links:
    lk.setdefault(l["ranks"], {})[l["kind"]] = (float(l["latency_us"]), float(l["bandwidth_gbs"]))
errs = [abs(float(r["rel_err"])) for r in out_rows if r["rel_err"]]
raws = [abs(float(r["rel_err_raw"])) for r in out_rows if r["rel_err_raw"]]
text = [
    "Command: `%s` (%s, %s cores; 1-minute load average %s at the start and %s at the end: other jobs "
    "shared the machine, and the real runs and the calibration measured it as it was)." % (cmd, date, cores, load0, load1),
    "",
    "- Layer: `%s`, real medians of %s repetitions after a warm-up (`scripts/mpirun.sh`, one StarPU CPU "
    "worker per rank), simulated once (deterministic) on `scripts/sim/platform.py --cpu`." % (layer, repeat),
    "- Compute rates, measured on one core just before (bench/sim/cpu_rates.c, OpenBLAS sgemm at the "
    "layer's expert GEMM shapes and a row gather): RMOE_SIM_CPU_GFLOPS=%s, RMOE_SIM_CPU_GBS=%s, "
    "RMOE_SIM_CPU_FLOOR_US=%s (not measured: the cost model's per-task floor)." % (gflops, gbs, floor_us),
    "- Links, measured with bench/hop/hop_bench.c under the same launcher and rank count and fitted as "
    "latency + bytes/bandwidth over 64 KB - 4 MB hops: " + "; ".join(
        "%s ranks: plain MPI %.0f us + %.2f GB/s, StarPU-MPI hop %.0f us + %.2f GB/s" %
        (n, v["mpi"][0], v["mpi"][1], v["starpu"][0], v["starpu"][1]) for n, v in sorted(lk.items())) + ".",
    "- raw: plain MPI's link and a dedicated core per rank (what the hardware alone explains); calibrated: "
    "StarPU-MPI's measured hop as the link and the CPU rates times min(1, cores/ranks). The tolerance "
    "(%g%%) applies to the calibrated simulation." % (tol * 100),
]
after = [
    "Largest error: calibrated %s, raw %s. %s" % (
        ("%.0f%%" % (100 * max(errs))) if errs else "n/a", ("%.0f%%" % (100 * max(raws))) if raws else "n/a",
        "Every calibrated case is within the tolerance." if all_ok else
        "Not every calibrated case is within the tolerance (rows marked no)."),
    "",
    "What the simulation does not model, and why the raw variant misses: the real ranks share %s cores "
    "with their StarPU worker, StarPU-MPI's progress thread and the main thread each, so a rank waits for "
    "the core (the simulation gives every worker its own core: the calibrated variant divides the rates "
    "by ranks/cores, a first-order correction); StarPU-MPI's progress thread polls and sleeps, so a "
    "message waits milliseconds on a busy machine where the simulated link takes microseconds (the "
    "calibrated variant folds the measured hop cost into the link's latency, which then also applies to "
    "the small messages a real run overlaps); and per-task scheduling and wake-up costs beyond the "
    "cost model's floor. On GPUs with a core per driver thread, these effects are small against the "
    "hop times of the EP sweep." % cores,
]
meta = {"command": cmd, "date": date, "tolerance_pct": tol * 100, "cores": int(cores), "cpu_gflops": float(gflops),
        "cpu_gbs": float(gbs), "floor_us": float(floor_us), "links": lk, "text": text, "after": after,
        "all_within_tolerance": all_ok}
with open(out + "/sim_check.meta.json", "w") as f:
    json.dump(meta, f, indent=1)
    f.write("\n")
print("sim/check_real.sh: %s" % after[0])
sys.exit(0 if all_ok else 3)
EOF
"$py" "$root/bench/sim/report.py" md --out "$out"
echo "sim/check_real.sh: wrote $out/sim_check.csv and $out/sim.md"
[ $rc -eq 0 ] || exit 1
