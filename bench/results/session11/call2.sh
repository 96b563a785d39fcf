#!/usr/bin/env bash
# Branch pdl: programmatic dependent launches in captured decode graphs (kernels/launch.py `launch`), with
# linear_split loading its weight before it waits. GPU tests, then G1 / G2 with PDL and the two branch kernels
# on and off (launch.PDL, linear_split.MAX_ROWS, norm_linear.MAX_ROWS), then the decode profile of the first.
source bench/device_call.sh
python3 -c "
import cupy; from barerl.kernels.build import load_kernel
k = load_kernel('swiglu.cu', 'swiglu_forward', {'DTYPE': '__nv_bfloat16'}); print(type(k.kernel), hex(k.kernel.ptr))" > $L/probe.log 2>&1; cat $L/probe.log
t tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_launch.py tests/kernels/test_linear_split.py \
  tests/kernels/test_norm_linear.py tests/kernels/test_model_gpu.py tests/engine/test_cuda_graph_runner.py > $L/tests.log 2>&1; tail -15 $L/tests.log
W="python3 bench/with_settings.py"; G="bench/bench_generate.py --no-peer"
NORM0=barerl.kernels.norm_linear.MAX_ROWS=0; SPLIT0=barerl.kernels.linear_split.MAX_ROWS=0; PDL0=barerl.kernels.launch.PDL=False
run() { local name=$1; shift; t $name 80 $W "$@" -- $G --csv $L/$name.csv > $L/$name.log 2>&1; grep -E "^G. barerl:|Error" $L/$name.log; }
run pdl_split $NORM0
run plain_neither $NORM0 $SPLIT0 $PDL0
run pdl_neither $NORM0 $SPLIT0
run plain_split $NORM0 $PDL0
run pdl_split_norm
t profile 60 $W $NORM0 -- bench/profile_decode.py > $L/profile.log 2>&1; sed -n 1,16p $L/profile.log
t products 40 python3 bench/bench_decode_products.py 2>&1 | tee $L/products.log
finish
