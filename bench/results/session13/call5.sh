#!/usr/bin/env bash
# Session 13, call 5: main as it lands (the sampler's T = 1 mass path is the only package change): sampler GPU
# tests, decode profile, G1 with transformers, R1 resident and offloaded, G2, then TRL 1.16's R1 with the time
# that is left.
source bench/device_call.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t tests 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_sample.py > $L/tests.log 2>&1; tail -1 $L/tests.log
t profile 40 python3 bench/profile_decode.py > $L/profile.log 2>&1; sed -n 1,16p $L/profile.log
t gen_g1 200 python3 bench/bench_generate.py --workloads G1 --csv $L/gen_g1.csv > $L/gen_g1.log 2>&1; grep -E "^G. (barerl|transformers):|Error" $L/gen_g1.log; tail -4 $L/gen_g1.log
R1="python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16"
t r1_keep 100 $R1 --keep attention,linear --json $L/r1_keep.json > $L/r1_keep.log 2>&1; grep -E "^R1|Error" $L/r1_keep.log
t r1_off 100 $R1 --offload-optimizer --json $L/r1_off.json > $L/r1_off.log 2>&1; grep -E "^R1|Error" $L/r1_off.log
t gen_g2 60 python3 bench/bench_generate.py --no-peer --workloads G2 --csv $L/gen_g2.csv > $L/gen_g2.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_g2.log
finish
t trl $((590 - SECONDS)) env PYTHONPATH=$PYTHONPATH:/tmp/site python3 bench/bench_grpo_trl.py --steps 3 --json $L/r1_trl.json > $L/r1_trl.log 2>&1; tail -4 $L/r1_trl.log
finish
