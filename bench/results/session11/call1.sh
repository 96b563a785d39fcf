#!/usr/bin/env bash
# For the branch norm-linear-rows (not run in session 10: no device time was left). The fused norm + product
# kernels with row-ordered loads (norm_linear) and the long-K cluster kernel (linear_split): their GPU tests,
# the model and engine GPU tests that take them, cold timings against what they replace, G1 / G2 with both, with
# each alone and with neither, in one call.
source bench/device_call.sh
t tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_norm_linear.py \
  tests/kernels/test_linear_split.py tests/kernels/test_linear.py tests/kernels/test_model_gpu.py \
  tests/engine/test_cuda_graph_runner.py > $L/tests.log 2>&1; tail -12 $L/tests.log
t products 40 python3 bench/bench_decode_products.py 2>&1 | tee $L/products.log
G="bench/bench_generate.py --no-peer"
t gen 80 python3 $G --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "^G. barerl:|Error" $L/gen.log
t gen_no_split 80 python3 bench/with_settings.py barerl.kernels.linear_split.MAX_ROWS=0 -- $G --csv $L/gen_no_split.csv > $L/gen_no_split.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_no_split.log
t gen_no_norm 80 python3 bench/with_settings.py barerl.kernels.norm_linear.MAX_ROWS=0 -- $G --csv $L/gen_no_norm.csv > $L/gen_no_norm.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_no_norm.log
t gen_neither 80 python3 bench/with_settings.py barerl.kernels.norm_linear.MAX_ROWS=0 barerl.kernels.linear_split.MAX_ROWS=0 -- $G --csv $L/gen_neither.csv > $L/gen_neither.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_neither.log
t profile 60 python3 bench/profile_decode.py > $L/profile.log 2>&1; sed -n 1,16p $L/profile.log
finish
