#!/usr/bin/env bash
# Bad input given to relaymoe: every case must end with the expected exit
# status, a message that names the value and what was expected, no hang,
# and no output file (--dump, --csv). Each case's name is a row of the
# table in docs/hardening.md.
#   test_bad_input.sh RELAYMOE MPIEXEC SOURCE_DIR WORK_DIR
set -uo pipefail
app=$1 mpiexec=$2 src=$3 work=$4
py=/usr/bin/python3
$py -c "import numpy" 2>/dev/null || { echo "python3-numpy missing"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
fails=0 cases=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

small=(--hidden 32 --ffn 16 --experts 8 --topk 2 --tokens 40 --repeat 1 --quiet)
never=(--dump "$work/never-dir" --csv "$work/never.csv")

# expect NAME STATUS PATTERN NP ARGS...: relaymoe on NP ranks; the exit
# status must be STATUS, PATTERN must be in the output (a grep -E pattern)
# and no output file may exist afterwards.
expect() {
  local name=$1 want=$2 pat=$3 np=$4
  shift 4
  local out rc
  cases=$((cases + 1))
  # One rank runs as an MPI singleton: the same program, without the
  # launcher's start-up time.
  if [ "$np" -eq 1 ]; then
    out=$(timeout 120 "$app" "$@" 2>&1)
  else
    out=$(timeout 120 "$mpiexec" -n "$np" --oversubscribe "$app" "$@" 2>&1)
  fi
  rc=$?
  last_out=$out
  if [ $rc -eq "$want" ] && grep -qE -- "$pat" <<<"$out"; then
    ok "$name: exit $rc: $(grep -m1 -E -- "$pat" <<<"$out" | sed 's/^relaymoe: rank [0-9]*: //')"
  else
    bad "$name (exit $rc, wanted $want and /$pat/)"
    echo "$out" | tail -20
  fi
  if [ -e "$work/never-dir" ] || [ -e "$work/never.csv" ]; then
    bad "$name: left an output file behind"
    rm -rf "$work/never-dir" "$work/never.csv"
  fi
}

# every_rank NAME PATTERN NP ARGS...: as expect (exit 1), and the message
# comes from every one of the NP ranks.
every_rank() {
  local name=$1 pat=$2 np=$3
  shift 3
  expect "$name" 1 "$pat" "$np" "$@"
  local n
  n=$(grep -E -- "$pat" <<<"$last_out" | grep -oE "^relaymoe: rank [0-9]+" | sort -u | wc -l)
  [ "$n" -eq "$np" ] && ok "$name: all $np ranks report it" || bad "$name: $n of $np ranks report it"
}

# ---- the command line ---------------------------------------------------------
expect "no command" 2 "usage: mpirun -np N relaymoe COMMAND" 1
expect "unknown command" 2 "unknown command 'frobnicate'" 1 frobnicate
expect "option typo" 2 "unknown option '--tokns' \(did you mean --tokens\?\)" 1 run --tokns 5 "${never[@]}"
expect "unknown option" 2 "unknown option '--colour'; see --help" 1 run --colour "${never[@]}"
expect "missing value" 2 "--tokens needs a value \(T\)" 1 run "${never[@]}" --tokens
expect "not a number" 2 "--topk 'x': expected an integer from 1 to 1000000" 1 run --topk x "${never[@]}"
expect "trailing garbage" 2 "--hidden '32k': expected an integer" 1 run --hidden 32k "${never[@]}"
expect "zero size" 2 "--tokens '0': expected an integer from 1 to" 1 run --tokens 0 "${never[@]}"
expect "negative size" 2 "--ffn '-4': expected an integer from 1 to" 1 run --ffn -4 "${never[@]}"
expect "number past int64" 2 "--tokens '99999999999999999999': expected an integer" 1 run --tokens 99999999999999999999 "${never[@]}"
expect "empty value" 2 "--load: expected a non-empty value" 1 run --load= "${never[@]}"
expect "flag given a value" 2 "--check takes no value \(got 'yes'\)" 1 run --check=yes "${never[@]}"
expect "stray argument" 2 "unexpected argument 'tokens': options start with --" 1 run tokens "${never[@]}"
expect "repeat out of range" 2 "--repeat '0': expected an integer from 1 to 1000" 1 run --repeat 0 "${never[@]}"
expect "scale not a number" 2 "--scale 'nan': expected a number from 1 to" 1 run --preset MoE-E64 --scale nan "${never[@]}"
expect "bad byte count" 2 "--mem-cap '12Q': expected a byte count" 1 run --mem-cap 12Q "${never[@]}"
expect "unknown preset" 2 "--preset 'Qwen9' is not a known shape; expected one of Qwen3-30B-A3B" 1 run --preset Qwen9 "${never[@]}"
expect "scale without preset" 2 "--scale 4 needs --preset" 1 run --scale 4 "${never[@]}"
expect "scale leaves zero" 2 "--scale 1e\+06 leaves MoE-E64 with hidden=0" 1 run --preset MoE-E64 --scale 1e6 "${never[@]}"
expect "unknown dispatch" 2 "--dispatch 'rings': expected ring, token, a2a, a2a-megatron, a2a-deepep, auto, both, baselines or all" 1 run --dispatch rings "${never[@]}"
expect "unknown dtype" 2 "--dtype 'bf32': expected f32 or bf16" 1 run --dtype bf32 "${never[@]}"
expect "unknown io" 2 "--io 'gpu': expected host or device" 1 run --io gpu "${never[@]}"
expect "plan option typo" 2 "did you mean --ranks" 1 plan --rank 8

# ---- configuration values ------------------------------------------------------
expect "topk above experts" 2 "topk = 9 is larger than experts = 8: expected 1 <= K <= E" 2 run "${small[@]}" --topk 9 "${never[@]}"
expect "experts not divisible by ranks" 2 "experts = 8 is not divisible by the 3 ranks of the group: expected a multiple of 3" 3 run "${small[@]}" "${never[@]}"
expect "fewer experts than ranks" 2 "experts = 2 is not divisible by the 4 ranks" 4 run "${small[@]}" --experts 2 --topk 1 "${never[@]}"
expect "pairs overflow int32" 2 "tokens x topk = 1000000000000 x 8 pairs: more than 2147483647" 1 run --tokens 1000000000000 "${never[@]}"
expect "buffer over 2^32 elements" 2 "tokens x hidden = 40000000 x 128 elements: more than 4294967295" 1 run --tokens 40000000 "${never[@]}"
expect "expert weights over 2^32 elements" 2 "partition weights .* more than 4294967295" 1 run --hidden 100000 --ffn 100000 --experts 1 --topk 1 --tokens 1 "${never[@]}"
expect "gated shared expert without one" 2 "--shared-gated needs a shared expert: expected --shared-ffn FS with FS > 0" 1 run --shared-gated "${never[@]}"
expect "both top-k normalisations" 2 "--norm-topk and --no-norm-topk: expected one of them" 1 run --norm-topk --no-norm-topk "${never[@]}"
expect "shared expert too wide" 2 "shared expert weights = 384 x 1000000000 elements" 1 run --shared-ffn 1000000000 "${never[@]}"
expect "partitions not dividing the experts" 2 "partitions = 3 does not divide the 8 experts of each of the 1 rank\(s\): expected a divisor of experts/ranks" 1 run "${small[@]}" --partitions 3 "${never[@]}"
expect "ring window of one buffer" 2 "window = 1: expected 0 \(default 2\) or at least 2 receive buffers per relayed kind" 2 run "${small[@]}" --window 1 "${never[@]}"
every_rank "unknown scheduling policy" "scheduling policy 'nosuchpolicy' is not one StarPU knows: expected one of eager, prio" 2 run "${small[@]}" --sched nosuchpolicy "${never[@]}"
every_rank "device activations without a GPU" "--io device: rmoe_ctx_alloc: RMOE_MEMORY_DEVICE but rank [0-9] has no CUDA worker" 2 run "${small[@]}" --io device "${never[@]}"
expect "memory cap too small" 1 "mem_cap|memory cap|cap of" 2 run "${small[@]}" --dispatch ring --mem-cap 1K "${never[@]}"
RMOE_WAIT_TIMEOUT=soon expect "malformed RMOE_WAIT_TIMEOUT" 2 "wait_timeout = -1: expected 0 \(wait forever\) or seconds" 1 run "${small[@]}" "${never[@]}"

# ---- .npy files (--load) ---------------------------------------------------------
mkdir -p "$work/in"
$py "$src/tests/app/moe_numpy.py" make "$work/in" --ranks 2 --tokens 40 --hidden 32 --ffn 16 --experts 8 --seed 5 > /dev/null
# variant NAME PYTHON: a copy of the good inputs changed by PYTHON (d: its directory)
variant() {
  rm -rf "${work:?}/$1" && cp -r "$work/in" "$work/$1"
  $py -c "import numpy as np, os; d = '$work/$1'; $2"
}
# npy_case NAME PATTERN VARIANT PYTHON: every rank refuses to --load the
# variant of the good inputs that PYTHON makes.
npy_case() {
  variant "$3" "$4"
  every_rank "$1" "$2" 2 run "${small[@]}" --load "$work/$3" "${never[@]}"
}
# finite_case NAME PATTERN VARIANT PYTHON [ARGS...]: the same variant run
# with --check-finite (and ARGS) ends with exit 1 and PATTERN.
finite_case() {
  local name=$1 pat=$2 dir=$3
  variant "$dir" "$4"
  shift 4
  expect "$name" 1 "$pat" 2 run "${small[@]}" --check-finite "$@" --load "$work/$dir" "${never[@]}"
}
npy_case "bad magic" "w_router.npy: not a .npy file \(bad magic\)" magic "open(d + '/w_router.npy', 'wb').write(b'not a numpy file')"
npy_case "wrong dtype" "w_router.npy: dtype '<f8' but expected '<f4'" dtype "np.save(d + '/w_router.npy', np.zeros((32, 8), np.float64))"
npy_case "big-endian float32" "w_up.npy: dtype '>f4' but expected '<f4'" bigendian "np.save(d + '/w_up.npy', np.zeros((8, 32, 16), '>f4'))"
npy_case "Fortran order" "w_router.npy: fortran_order is True but expected False" order "np.save(d + '/w_router.npy', np.asfortranarray(np.ones((32, 8), np.float32)))"
npy_case "wrong shape" "w_router.npy: shape \(32, 9\) but expected \(32, 8\)" shape "np.save(d + '/w_router.npy', np.zeros((32, 9), np.float32))"
npy_case "wrong number of dimensions" "x.npy: shape \(80, 32, 1\) but expected \(80, 32\)" rank3 "np.save(d + '/x.npy', np.zeros((80, 32, 1), np.float32))"
npy_case "truncated data" "w_down.npy: truncated: shape needs 4096 float32 values" trunc "p = d + '/w_down.npy'; b = open(p, 'rb').read(); open(p, 'wb').write(b[:len(b) - 100])"
npy_case "truncated header" "x.npy: header length [0-9]+ runs past the end of the file" trunchdr "p = d + '/x.npy'; b = open(p, 'rb').read(); open(p, 'wb').write(b[:40])"
npy_case "empty file" "dy.npy: empty file, not a .npy file" empty "open(d + '/dy.npy', 'wb').close()"
npy_case "directory instead of a file" "x.npy: not a regular file" isdir "os.remove(d + '/x.npy'); os.mkdir(d + '/x.npy')"
expect "load directory missing" 1 "--load $work/nowhere: not a readable directory" 2 run "${small[@]}" --load "$work/nowhere" "${never[@]}"

# ---- non-finite values -------------------------------------------------------------
finite_case "NaN in x (--check-finite)" "rank 1: x\[5, 7\] = nan \(row of this rank's 40 tokens\): expected finite values" nan_x "x = np.load(d + '/x.npy'); x[45, 7] = np.nan; np.save(d + '/x.npy', x)"
finite_case "infinity in w_gate (--check-finite)" "rank 1: w_gate\[6\]\[3, 2\] = inf: expected finite values" inf_w "w = np.load(d + '/w_gate.npy'); w[6, 3, 2] = np.inf; np.save(d + '/w_gate.npy', w)"
finite_case "infinity in w_router (--check-finite)" "rank 0: w_router\[0, 0\] = -inf: expected finite values" nan_r "w = np.load(d + '/w_router.npy'); w[0, 0] = -np.inf; np.save(d + '/w_router.npy', w)"
finite_case "NaN in dy (--check-finite)" "rank 0: dy\[3, 31\] = nan" nan_dy "g = np.load(d + '/dy.npy'); g[3, 31] = np.nan; np.save(d + '/dy.npy', g)" --dispatch a2a

# ---- cluster descriptions (relaymoe plan --cluster; the context reads the same) --
cl="$work/bad.cluster"
cluster_case() { # NAME PATTERN TEXT
  printf '%b' "$3" > "$cl"
  expect "$1" 2 "$2" 1 plan --cluster "$cl" --ranks 2
}
cluster_case "cluster: unknown key" "line 3: key 'colour': expected before any section" 'name = x\nnodes = 1\ncolour = blue\n'
cluster_case "cluster: bad number" "line 2: nodes 'two': expected an integer from 1 to 1000000" 'name = x\nnodes = two\n'
cluster_case "cluster: key set twice" "line 3: 'nodes' is already set on line 2" 'name = x\nnodes = 1\nnodes = 2\n'
cluster_case "cluster: unknown link" "line 2: link 'infiniband': expected same_device" 'name = x\n[link infiniband]\n'
cluster_case "cluster: missing key" "'memory' is missing; expected e.g. 'memory = 64G in \[device\]'" 'name = x\nnodes = 1\ndevices_per_node = 0\nranks_per_node = 1\n[device]\nbf16_tflops = 1\nf32_tflops = 1\n'
cluster_case "cluster: NUL byte" "line 1: a NUL byte: expected text" 'name = x\0\n'
cluster_case "cluster: placement beyond the machine" "rank_nodes puts rank 1 on node 5: expected a node below nodes = 2" 'name = x\nnodes = 2\ndevices_per_node = 0\nranks_per_node = 2\n[device]\nbf16_tflops = 1\nf32_tflops = 1\nmemory = 1G\n[link shm]\nbandwidth_gbs = 1\nlatency_us = 1\n[link network]\nbandwidth_gbs = 1\nlatency_us = 1\n[placement]\nrank_nodes = 0 5\n'
expect "cluster: file missing" 2 "cannot open" 1 plan --cluster "$work/none.cluster" --ranks 2

echo "test_bad_input: $cases cases, $fails failure(s)"
[ $fails -eq 0 ]
