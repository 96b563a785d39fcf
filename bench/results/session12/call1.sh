#!/usr/bin/env bash
# The cuBLASLt configuration search for decode-sized products (kernels/cublaslt.py _SEARCH_DECODE): GPU tests,
# the products cold (searched choice against every heuristic candidate), G1 / G2 with the searched choices
# against the carried (heuristic-only) ones, twice each, and the decode profile with the searched choices.
source bench/device_call.sh
S=/tmp/search; mkdir -p $S
python3 - "$S" <<'PY'  # the carried choices without the decode-sized ones (M <= 256): only those are searched
import glob, json, os, re, sys
for path in glob.glob(os.path.expanduser("~/.cache/barerl/cublaslt-*.json")):
    kept = {k: v for k, v in json.load(open(path)).items() if int(re.search(r"m<=(\d+)", k).group(1)) > 256}
    json.dump(kept, open(os.path.join(sys.argv[1], os.path.basename(path)), "w"))
    print(os.path.basename(path), "kept", len(kept))
PY
t tests 200 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/kernels/test_cublaslt.py tests/kernels/test_linear.py \
  tests/kernels/test_model_gpu.py > $L/tests.log 2>&1; grep -E "searched:|passed|failed|Error" $L/tests.log | tail -6
t gemm 200 env BARERL_CACHE_DIR=$S python3 bench/bench_gemm.py --rows G1 G2 > $L/gemm.log 2>&1; tail -9 $L/gemm.log
G="bench/bench_generate.py --no-peer"
t gen_search 150 env BARERL_CACHE_DIR=$S python3 $G --csv $L/gen_search.csv > $L/gen_search.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_search.log
t gen_old 80 python3 $G --csv $L/gen_old.csv > $L/gen_old.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_old.log
t gen_search2 80 env BARERL_CACHE_DIR=$S python3 $G --csv $L/gen_search2.csv > $L/gen_search2.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_search2.log
t gen_old2 80 python3 $G --csv $L/gen_old2.csv > $L/gen_old2.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_old2.log
t profile 60 env BARERL_CACHE_DIR=$S python3 bench/profile_decode.py > $L/profile.log 2>&1; sed -n 1,16p $L/profile.log
cp $S/cublaslt-*.json $OUT/ 2>/dev/null
finish
