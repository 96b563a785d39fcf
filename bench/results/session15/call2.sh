#!/usr/bin/env bash
# Session 15, call 2: paged attention walking each query's keys newest first (NEWEST_FIRST=1), so GRPO's shared
# prompt blocks are read last, in the kernel's bandwidth-bound steady state, while the samples' CTAs are in step
# (L2 hits); its GPU tests, kernel A/B, G1 / G2 A/B; the read-only HBM bandwidth.
source bench/device_call.sh
PA=barerl.kernels.paged_attention
t tests_nf 240 python3 -c "import sys, pytest, barerl.kernels.paged_attention as p; p._NEWEST_FIRST = 1; sys.exit(pytest.main(['-q', '-x', '-m', 'gpu', 'tests/kernels/test_paged_attention.py', 'tests/kernels/test_model_gpu.py', 'tests/engine/test_cuda_graph_runner.py']))" > $L/tests_nf.log 2>&1; tail -3 $L/tests_nf.log
t read 60 python3 bench/results/session15/read_probe.py > $L/read.log 2>&1; cat $L/read.log
t paged_a 60 python3 bench/profile_attention.py --paged 4,2 > $L/paged_a.log 2>&1; cat $L/paged_a.log
t paged_nf 60 python3 bench/with_settings.py $PA._NEWEST_FIRST=1 -- bench/profile_attention.py --paged 4,2 2,3 > $L/paged_nf.log 2>&1; cat $L/paged_nf.log
G="bench/bench_generate.py --no-peer"
for run in 1 2; do
  t g1_a$run 60 python3 $G --workloads G1 --csv $L/g1_a$run.csv > $L/g1_a$run.log 2>&1; grep -E "^G. barerl:|Error" $L/g1_a$run.log
  t g1_nf$run 60 python3 bench/with_settings.py $PA._NEWEST_FIRST=1 -- $G --workloads G1 --csv $L/g1_nf$run.csv > $L/g1_nf$run.log 2>&1; grep -E "^G. barerl:|Error" $L/g1_nf$run.log
done
finish
t g2_a 60 python3 $G --workloads G2 --csv $L/g2_a.csv > $L/g2_a.log 2>&1; grep -E "^G. barerl:|Error" $L/g2_a.log
t g2_nf 60 python3 bench/with_settings.py $PA._NEWEST_FIRST=1 -- $G --workloads G2 --csv $L/g2_nf.csv > $L/g2_nf.log 2>&1; grep -E "^G. barerl:|Error" $L/g2_nf.log
finish
