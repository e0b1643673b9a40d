"""The memory report's inputs (bench/memory/summarize.py's load step): the
runs' CSVs, PyTorch's measurements and check log, `relaymoe plan --json`
for the model's resident bytes and full-size peaks, and the machine."""
import csv
import datetime
import glob
import json
import os
import platform
import subprocess
import time

from summary_compute import FULLSIZE_EP, FULLSIZE_PRESETS, FULLSIZE_TOKENS, QUICK_PRESETS, by_point

# The run CSV's columns that are not numbers.
TEXT_COLUMNS = ("dispatch", "dtype", "sched", "starpu", "io", "device_cache")
INT_COLUMNS = ("ranks", "hidden", "ffn", "experts", "topk", "tokens", "chunk_rows")


def load_runs(d):
    """Every row of every `relaymoe run --csv` in DIR, numbers parsed, with
    the preset, token factor and dispatch option its file name records
    (NNN__PRESET__RANKS__FACTOR__DISPATCH.csv)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(d, "*__*.csv"))):
        _, preset, ranks, factor, run_dispatch = os.path.basename(path)[:-4].split("__")
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                for k, v in r.items():
                    if k not in TEXT_COLUMNS:
                        r[k] = float(v)
                for k in INT_COLUMNS:
                    r[k] = int(r[k])
                r["preset"] = preset
                r["token_factor"] = float(factor)
                r["run_dispatch"] = run_dispatch
                rows.append(r)
    return rows


def load_torch(d):
    """torch_moe.py bench's measurements (torch__PRESET__ROUND.json), each
    with its preset."""
    out = []
    for path in sorted(glob.glob(os.path.join(d, "torch__*.json"))):
        with open(path) as f:
            t = json.load(f)
        t["preset"] = os.path.basename(path).split("__")[1]
        out.append(t)
    return out


def load_check_log(d):
    """torch_moe.py check's log, empty when it did not run."""
    path = os.path.join(d, "check.log")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def plan(app, preset, ranks, tokens=None, scale=None, dtype="bf16"):
    cmd = [app, "plan", "--preset", preset, "--ranks", str(ranks), "--dtype", dtype, "--json"]
    if scale:
        cmd += ["--scale", str(scale)]
    if tokens:
        cmd += ["--tokens", str(tokens)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def load_plans(app, points, scale, quick):
    """The model's answers: at each measured point (preset, ranks, tokens)
    its resident bytes in f32, as measured; at full size (bf16, the paper's
    token counts, FULLSIZE_EP) each shape's peaks."""
    resident = {(preset, ranks, tokens): plan(app, preset, ranks, tokens=tokens, scale=f"{scale:g}", dtype="f32")
                for preset, ranks, tokens in sorted(points)}
    presets = QUICK_PRESETS if quick else FULLSIZE_PRESETS
    fullsize = [((tokens, preset, ep), plan(app, preset, ep, tokens=tokens))
                for tokens in FULLSIZE_TOKENS for preset in presets for ep in FULLSIZE_EP]
    return {"resident": resident, "fullsize": fullsize}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine(start):
    """What the report's header says of this machine and of the run's
    duration (start: seconds since the epoch), read when the report is
    written."""
    return {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(), "cpu": cpu_model(),
            "arch": platform.machine(), "elapsed": int(time.time()) - start}


def load(runs_dir, app, scale, quick):
    """Every input of the report but the machine's."""
    rows = load_runs(runs_dir)
    return {"runs_dir": runs_dir, "rows": rows, "torch": load_torch(runs_dir),
            "check_log": load_check_log(runs_dir), "plans": load_plans(app, by_point(rows), scale, quick)}
