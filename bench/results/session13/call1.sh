#!/usr/bin/env bash
# Session 13, call 1: sample_plain_rows (a cluster per plain row, one read of the logits) and the T = 1 path
# of the mass passes: GPU tests, the sampler A/B, decode profile and G1 / G2 with it on (B) and off (A), then
# session 12's untried L2 prefetch-size hint on paged attention's KV loads (call6.sh's probe).
source bench/device_call.sh
S=bench/results/session13
W="python3 bench/with_settings.py barerl.kernels.sampling._PLAIN_ROWS=False --"
t tests 240 python3 -m pytest -q -x -m gpu tests/kernels/test_sample.py tests/kernels/test_compile.py \
  tests/engine/test_cuda_graph_runner.py tests/kernels/test_model_gpu.py > $L/tests.log 2>&1; tail -3 $L/tests.log
t sample 120 python3 $S/sample_probe.py > $L/sample.log 2>&1; cat $L/sample.log
t profile_b 60 python3 bench/profile_decode.py > $L/profile_b.log 2>&1; sed -n 1,5p $L/profile_b.log; grep -E "^sample" $L/profile_b.log
t profile_a 60 $W bench/profile_decode.py > $L/profile_a.log 2>&1; sed -n 1,5p $L/profile_a.log; grep -E "^sample" $L/profile_a.log
t gen_b 120 python3 bench/bench_generate.py --no-peer --csv $L/gen_b.csv > $L/gen_b.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_b.log
t gen_a 120 $W bench/bench_generate.py --no-peer --csv $L/gen_a.csv > $L/gen_a.log 2>&1; grep -E "^G. barerl:|Error" $L/gen_a.log
P="python3 bench/results/session12/l2_hint_probe.py"
M=src/barerl/kernels/csrc/mma.cuh
cp $M /tmp/mma.cuh
t l2_plain 60 $P plain
for hint in 128B 256B; do
  sed -i "s|cp.async.cg.shared.global\(.L2::[0-9]*B\)\? \[|cp.async.cg.shared.global.L2::$hint [|" $M; grep -c "L2::$hint" $M
  t l2_$hint 60 $P L2::$hint
done
cp /tmp/mma.cuh $M
finish
