#!/usr/bin/env bash
# Runs the Python tests under mpiexec with the fixture setup.sh made: the
# virtual environment's python, RELAYMOE_PREFIX at the installed library.
# Exit 77 (skipped) when the fixture found something missing.
#   run.sh WORK MPIEXEC NRANKS pytest TESTS_DIR
#   run.sh WORK MPIEXEC NRANKS script SCRIPT
#   run.sh WORK MPIEXEC NRANKS readme SOURCE_DIR   the two examples of docs/embedding.md
#   run.sh WORK MPIEXEC NRANKS pytest-hf FILE | script-hf SCRIPT | readme-hf SOURCE_DIR
#                                                 relaymoe.hf with transformers (docs/embedding.md's example)
set -euo pipefail
work=$1 mpiexec=$2 n=$3 kind=$4 what=$5
status=$(cat "$work/status" 2> /dev/null || echo "unavailable: the python_setup fixture did not run")
[ "$status" = ok ] || { echo "$status"; exit 77; }
export RELAYMOE_PREFIX=$work/prefix PYTHONDONTWRITEBYTECODE=1
py=$work/venv/bin/python
case $kind in
  pytest) exec "$mpiexec" -n "$n" --oversubscribe "$py" -m pytest -q -p no:cacheprovider --color=no -rs \
            --rootdir="$what" "$what" ;;
  script) exec "$mpiexec" -n "$n" --oversubscribe "$py" "$what" ;;
  readme)
    rm -rf "${work:?}/readme" && mkdir -p "$work/readme" && cd "$work/readme"
    doc=$what/docs/embedding.md
    python3 "$what/tests/python/readme_example.py" "$doc" \
      "from mpi4py import MPI  # MPI_THREAD_MULTIPLE; without mpi4py, relaymoe starts MPI itself" > moe.py
    python3 "$what/tests/python/readme_example.py" "$doc" "from mpi4py import MPI" > moe_torch.py
    "$what/scripts/mpirun.sh" -np "$n" "$py" moe.py | tee out.txt
    torch=1
    if ! "$py" -c "import torch" 2> /dev/null; then
      [ "${RMOE_EMBED_REQUIRE:-0}" = 1 ] && { echo "python3-torch missing (RMOE_EMBED_REQUIRE=1)"; exit 1; }
      echo "python3-torch missing: the PyTorch example is not run"
      torch=0
    fi
    [ $torch = 0 ] || "$what/scripts/mpirun.sh" -np "$n" "$py" moe_torch.py | tee -a out.txt
    for r in $(seq 0 $((n - 1))); do
      # Ranks' lines may arrive interleaved: no anchors.
      grep -q "rank $r: experts range(" out.txt
      [ $torch = 0 ] || grep -q "rank $r: loss " out.txt
    done
    grep -q "x: dtype float64, expected float32" out.txt ;;
  pytest-hf|script-hf|readme-hf)
    # relaymoe.hf against Hugging Face transformers: 77 where torch or
    # transformers is absent (scripts/setup.sh --hf installs both; .ci/run
    # fails on the skip, RMOE_EMBED_REQUIRE=1 here).
    if ! why=$("$py" -c "import torch, transformers" 2>&1); then
      [ "${RMOE_EMBED_REQUIRE:-0}" = 1 ] && { echo "torch or transformers missing (RMOE_EMBED_REQUIRE=1): $why"; exit 1; }
      echo "torch or transformers missing: skipped ($(tail -1 <<<"$why"))"; exit 77
    fi
    case $kind in
      pytest-hf) exec "$mpiexec" -n "$n" --oversubscribe "$py" -m pytest -q -p no:cacheprovider --color=no -rs \
                   -W ignore::UserWarning --rootdir="$(dirname "$what")" "$what" ;;
      script-hf) exec "$mpiexec" -n "$n" --oversubscribe "$py" -W ignore::UserWarning "$what" ;;
      readme-hf)
        rm -rf "${work:?}/readme-hf" && mkdir -p "$work/readme-hf" && cd "$work/readme-hf"
        python3 "$what/tests/python/readme_example.py" "$what/docs/embedding.md" \
          "from mpi4py import MPI  # Hugging Face MoE blocks on the ring" > hf.py
        "$what/scripts/mpirun.sh" -np "$n" "$py" -W ignore::UserWarning hf.py | tee out.txt
        for r in $(seq 0 $((n - 1))); do grep -q "rank $r: loss " out.txt; done ;;
    esac ;;
  *) echo "run.sh: unknown kind '$kind'" >&2; exit 2 ;;
esac
