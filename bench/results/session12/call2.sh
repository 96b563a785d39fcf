#!/usr/bin/env bash
# main with the configuration search (searched choices carried from call 1) and the hoisted loads of rmsnorm /
# qk_norm_rope: their GPU tests, the decode profile, G1 / G2 with transformers, R1 resident and offloaded,
# TRL 1.16's R1 with what time is left.
source bench/device_call.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
t tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_rmsnorm.py tests/kernels/test_qk_norm_rope.py \
  tests/kernels/test_store_kv.py tests/kernels/test_model_gpu.py tests/engine/test_cuda_graph_runner.py > $L/tests.log 2>&1; tail -3 $L/tests.log
t profile 60 python3 bench/profile_decode.py > $L/profile.log 2>&1; sed -n 1,16p $L/profile.log
t gen 200 python3 bench/bench_generate.py --csv $L/gen.csv > $L/gen.log 2>&1; grep -E "^G. (barerl|transformers):|Error|x$" $L/gen.log
R1="python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16"
t r1_keep 100 $R1 --keep attention,linear --json $L/r1_keep.json > $L/r1_keep.log 2>&1; grep -E "^R1|Error" $L/r1_keep.log
t r1_off 100 $R1 --offload-optimizer --json $L/r1_off.json > $L/r1_off.log 2>&1; grep -E "^R1|Error" $L/r1_off.log
cp $HOME/.cache/barerl/cublaslt-*.json $OUT/ 2>/dev/null
finish
t trl $((590 - SECONDS)) env PYTHONPATH=$PYTHONPATH:/tmp/site python3 bench/bench_grpo_trl.py --steps 3 --json $L/r1_trl.json > $L/r1_trl.log 2>&1; tail -4 $L/r1_trl.log
finish
