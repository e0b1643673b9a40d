#!/usr/bin/env bash
# Hardening stage (docs/hardening.md), after the main suite:
#  1. the suite (less the multihost, bench, subproject and long labels: flow_np8,
#     app_preset_routing, train_exactness_np4, the 6- and 8-rank stripe tests;
#     relaymoe.hf's python_hf_*; three program-level reruns named below)
#     built with ASan + UBSan (build-asan/), multi-rank tests included;
#  2. the unit tests under Valgrind memcheck (the main build, build/);
#  3. each libFuzzer target for RMOE_FUZZ_SECONDS (default 60) from its seed
#     corpus (build-fuzz/, clang); a crash input is kept in
#     build-fuzz/artifacts/ and belongs in tests/fuzz/regressions/<target>/.
# Each step prints its duration; any failure fails the stage.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)
start=$(date +%s)
step() { echo "hardening: $1 ($(($(date +%s) - start)) s)"; }
jobs=$(nproc)

RMOE_SETUP_EXTRA="clang libclang-rt-14-dev valgrind ${RMOE_SETUP_EXTRA:-}" ./scripts/setup.sh

# The environment of every test, as tests/CMakeLists.txt sets it, for the
# programs run here directly.
export STARPU_SILENT=1 STARPU_NCPU=1 STARPU_WORKERS_NOBIND=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ---- 1. AddressSanitizer + UndefinedBehaviorSanitizer -----------------------------
step "sanitizer build"
RMOE_BUILD_DIR="$here/build-asan" ./scripts/build.sh -DRMOE_SANITIZE=ON
step "test suite under ASan + UBSan"
(
  # Leaks are checked at every exit; the runtimes below relaymoe keep some
  # allocations until then (lsan.supp). Allocation failures return NULL, as
  # glibc's do, so that they reach relaymoe's error paths. The preloaded
  # nodlclose.so comes before the ASan runtime: verify_asan_link_order=0.
  export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0:allocator_may_return_null=1:detect_stack_use_after_return=0:verify_asan_link_order=0
  export LSAN_OPTIONS="suppressions=$here/tests/hardening/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export LD_PRELOAD="$here/build-asan/tests/hardening/librmoe_nodlclose.so"
  # multihost has a stage of its own (a lost peer under ASan is
  # hardening_kill_rank_np3); bench measures; subproject builds relaymoe
  # again, without the sanitizers. relaymoe.hf's tests (python_hf_*) add
  # Python code only: the C calls they make (rmoe_layer_backward_ex with
  # dprobs among them) run here in the python and train labels.
  # app_end_to_end, app_shared_gated and gpu_checks_dry run the program
  # over the library calls the mpi tests make here (every dispatcher, the
  # shared experts, bf16), and the program's own paths (options, files,
  # reports) run here in app_heap_run_np2, app_bf16_np4, app_task_fault_np2,
  # app_tokens_per_rank_*, hardening_bad_input and the fuzzers.
  ctest --test-dir build-asan --output-on-failure --timeout 600 -j"$jobs" -LE 'multihost|bench|subproject|long' \
    -E '^python_hf_|^app_end_to_end$|^app_shared_gated$|^gpu_checks_dry$'
)

# ---- 2. Valgrind memcheck on the unit tests ------------------------------------------
step "unit tests under Valgrind"
[ -x build/tests/unit/test_config ] || ./scripts/build.sh
vfail=0
for t in build/tests/unit/test_* build/tests/hardening/hardening_config; do
  [ -x "$t" ] || continue
  log="build/valgrind-$(basename "$t").log"
  # Valgrind's virtual CPU has no AVX-512: OpenBLAS picks its kernels for
  # that CPU itself, never the ones OPENBLAS_CORETYPE names for the real one.
  vrc=0
  STARPU_HOME="$here/build/starpu-home" env -u OPENBLAS_CORETYPE valgrind --tool=memcheck --error-exitcode=99 \
       --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite \
       --suppressions="$here/tests/hardening/valgrind.supp" --gen-suppressions=all \
       --num-callers=40 --log-file="$log" "$t" > "$log.out" 2>&1 || vrc=$?
  if [ $vrc -eq 0 ]; then
    echo "valgrind: $(basename "$t"): clean ($(grep -m1 -o 'ERROR SUMMARY: [0-9]* errors' "$log"))"
  elif [ $vrc -eq 77 ]; then
    # A test that cannot measure under Valgrind says so and skips.
    echo "valgrind: $(tail -1 "$log.out")"
  else
    echo "valgrind: $(basename "$t"): FAILED"; cat "$log.out" "$log"
    vfail=1
  fi
done
[ $vfail -eq 0 ]

# ---- 3. libFuzzer ----------------------------------------------------------------------
step "fuzz build (clang)"
CC=clang cmake -S "$here" -B build-fuzz -DRMOE_FUZZ=ON > /dev/null
cmake --build build-fuzz --target fuzz_npy fuzz_opts fuzz_cluster -j"$jobs"
seconds=${RMOE_FUZZ_SECONDS:-60}
mkdir -p build-fuzz/artifacts
# The three targets run side by side, each for $seconds s: one minute of the
# stage rather than three. New inputs go to a scratch corpus; the committed
# seeds are only read.
step "fuzz_npy, fuzz_opts, fuzz_cluster for $seconds s each, side by side"
pids=()
for t in npy opts cluster; do
  rm -rf "build-fuzz/corpus-$t" && mkdir -p "build-fuzz/corpus-$t"
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    build-fuzz/tests/fuzz/fuzz_$t -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$t-" \
      "build-fuzz/corpus-$t" "tests/fuzz/corpus/$t" > "build-fuzz/fuzz-$t.log" 2>&1 &
  pids+=($!)
done
ffail=0
i=0
for t in npy opts cluster; do
  if wait "${pids[$i]}"; then
    echo "fuzz_$t: $(grep -m1 -oE 'stat::number_of_executed_units: [0-9]+' "build-fuzz/fuzz-$t.log" |
                      sed 's/.*: //') executions in $seconds s, no crash"
  else
    echo "fuzz_$t: CRASH (the input is in build-fuzz/artifacts/; add it to tests/fuzz/regressions/$t/)"
    tail -60 "build-fuzz/fuzz-$t.log"
    ls -l build-fuzz/artifacts
    ffail=1
  fi
  i=$((i + 1))
done
[ $ffail -eq 0 ]
step "finished"
