#!/usr/bin/env bash
# Ran the code now on branch gate-up-swiglu (since removed from main: measured slower).
# Session 13, call 4: gate_up_swiglu (a decode step's gate_up product and SwiGLU in one launch, every load in
# flight at once; calls 2-3's whole-MLP kernel is on branch mlp-decode): GPU tests, the op alone against its
# two separate ops (cold weights), decode profile and G1 with it (B) and without (A).
source bench/device_call.sh
W="python3 bench/with_settings.py barerl.kernels.gate_up_swiglu._FUSED=False --"
t tests 240 python3 -m pytest -q -m gpu tests/kernels/test_gate_up_swiglu.py tests/kernels/test_compile.py \
  tests/engine/test_cuda_graph_runner.py tests/kernels/test_model_gpu.py > $L/tests.log 2>&1
grep -E "passed|failed" $L/tests.log | tail -2; grep -E "^(FAILED|ERROR)" $L/tests.log | head -10
t op 90 python3 bench/bench_gate_up_swiglu.py > $L/op.log 2>&1; tail -6 $L/op.log
t profile_b 60 python3 bench/profile_decode.py > $L/profile_b.log 2>&1; sed -n 1,16p $L/profile_b.log
t profile_a 60 $W bench/profile_decode.py > $L/profile_a.log 2>&1; sed -n 1,5p $L/profile_a.log
t gen_b 100 python3 bench/bench_generate.py --no-peer --workloads G1 --csv $L/gen_b.csv > $L/gen_b.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_b.log
t gen_a 100 $W bench/bench_generate.py --no-peer --workloads G1 --csv $L/gen_a.csv > $L/gen_a.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_a.log
t gen_b2 100 python3 bench/bench_generate.py --no-peer --workloads G1 --csv $L/gen_b2.csv > $L/gen_b2.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_b2.log
finish
