#!/usr/bin/env bash
# A/B of two latency cuts, bit-identical by construction: the sampler's chunk passes hold their 16 logits per
# thread in registers (all loads at once; the mass pass issues them before merging the row maximum), and
# paged attention's first KV request of split 0 no longer waits for context_lens before its block-table
# lookups. B = this commit, A = the previous sources (.carry/ab_old/, copied over B's for the A runs).
# GPU tests of B, decode kernel timings and the G1 profile for A and B, G1 / G2 for both, R1 offloaded for B.
source bench/device_call.sh
C=src/barerl/kernels/csrc; mkdir -p /tmp/b && cp $C/sampling.cu $C/paged_attention.cu /tmp/b/
use() { cp $1/sampling.cu $1/paged_attention.cu $C/; }
t tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_sample.py tests/kernels/test_paged_attention.py \
  tests/kernels/test_paged_attention_invariant.py > $L/tests.log 2>&1; tail -3 $L/tests.log
for v in b a; do
  use $([ $v = a ] && echo .carry/ab_old || echo /tmp/b)
  t kernels_$v 90 python3 bench/bench_decode_kernels.py --csv $L/kernels_$v.csv > $L/kernels_$v.log 2>&1
  grep -E "^decode G1: 64 seqs x 640 ctx  |^decode G2|^sample (64|256) x 151936 (temperature 1|top-k 50) " $L/kernels_$v.log
  t profile_$v 40 python3 bench/profile_decode.py > $L/profile_$v.log 2>&1; sed -n 1,5p $L/profile_$v.log; grep -E "^sample" $L/profile_$v.log
  t gen_$v 80 python3 bench/bench_generate.py --no-peer --csv $L/gen_$v.csv > $L/gen_$v.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_$v.log
done
use /tmp/b
t r1_off 100 python3 bench/bench_grpo_step.py --batch-invariant off --num-scheduler-steps 16 --offload-optimizer \
  --json $L/r1_off.json > $L/r1_off.log 2>&1; grep -E "^R1|Error" $L/r1_off.log
finish
