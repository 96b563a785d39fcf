#!/usr/bin/env bash
# Ran the code now on branch mlp-decode (since removed from main: measured slower).
# Session 13, call 2: mlp_decode (the decode MLP in one launch + a sum of its parts): GPU tests, the MLP
# alone against its three ops (cold weights), decode profile and G1 / G2 with it (B) and without (A).
source bench/device_call.sh
W="python3 bench/with_settings.py barerl.kernels.mlp_decode._FUSED=False --"
t tests 240 python3 -m pytest -q -m gpu tests/kernels/test_mlp_decode.py tests/kernels/test_sample.py \
  tests/kernels/test_compile.py tests/engine/test_cuda_graph_runner.py tests/kernels/test_model_gpu.py > $L/tests.log 2>&1
grep -E "passed|failed|Error" $L/tests.log | tail -5; grep -E "^(FAILED|ERROR)" $L/tests.log | head -10
t mlp 90 python3 bench/bench_mlp.py > $L/mlp.log 2>&1; cat $L/mlp.log | tail -8
t profile_b 60 python3 bench/profile_decode.py > $L/profile_b.log 2>&1; sed -n 1,16p $L/profile_b.log
t profile_a 60 $W bench/profile_decode.py > $L/profile_a.log 2>&1; sed -n 1,5p $L/profile_a.log
t gen_b 120 python3 bench/bench_generate.py --no-peer --csv $L/gen_b.csv > $L/gen_b.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_b.log
t gen_a 120 $W bench/bench_generate.py --no-peer --csv $L/gen_a.csv > $L/gen_a.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_a.log
finish
