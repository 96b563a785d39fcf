#!/usr/bin/env bash
# Branch pdl, second form: dependents are allowed only by paged attention after its KV loop (o_proj, when it
# is linear_split, loads its weight while attention's CTAs finish); every other kernel waits and allows none.
# The shared-memory limit fix (reserve_shared_memory). GPU tests, G1 / G2 A/B, decode profile, products, R1.
source bench/device_call.sh
t tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_launch.py tests/kernels/test_linear_split.py \
  tests/kernels/test_norm_linear.py tests/kernels/test_paged_attention.py tests/kernels/test_rmsnorm.py tests/kernels/test_model_gpu.py \
  tests/engine/test_cuda_graph_runner.py > $L/tests.log 2>&1; tail -6 $L/tests.log
W="python3 bench/with_settings.py"; G="bench/bench_generate.py --no-peer"
NORM0=barerl.kernels.norm_linear.MAX_ROWS=0; SPLIT0=barerl.kernels.linear_split.MAX_ROWS=0; PDL0=barerl.kernels.launch.PDL=False
run() { local name=$1; shift; t $name 80 $W "$@" -- $G --csv $L/$name.csv > $L/$name.log 2>&1; grep -E "^G. barerl:|Error" $L/$name.log; }
run pdl_split $NORM0
run plain_neither $NORM0 $SPLIT0 $PDL0
run pdl_neither $NORM0 $SPLIT0
run plain_split $NORM0 $PDL0
t profile 60 $W $NORM0 -- bench/profile_decode.py > $L/profile.log 2>&1; sed -n 1,16p $L/profile.log
t products 40 python3 bench/bench_decode_products.py 2>&1 | tee $L/products.log
R1="bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16 --keep attention,linear"
t r1_pdl_split 100 $W $NORM0 -- $R1 --json $L/r1_pdl_split.json > $L/r1_pdl_split.log 2>&1; grep -E "^R1|Error" $L/r1_pdl_split.log
t r1_plain 100 $W $NORM0 $SPLIT0 $PDL0 -- $R1 --json $L/r1_plain.json > $L/r1_plain.log 2>&1; grep -E "^R1|Error" $L/r1_plain.log
finish
