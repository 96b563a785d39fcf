#!/usr/bin/env bash
# session 9: why do extra (idle) CTAs in paged_attention_split's grid cost ~8 us at G1's shape? ncu metrics of
# three launches: G1 without sharing, the same with an empty SharedPrefix (512 idle CTAs), and with 8 groups of 8.
export PYTHONPATH=$PWD/src:$PWD/bench:$PWD/bench/results/session8 PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR && tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR
cat > /tmp/three_attentions.py <<'PY'
import cupy, numpy as np
from shared_prefix_attention import case
from barerl.backend import cuda
from barerl.backend.ref import SharedPrefix
args, _ = case(0)
z = lambda: cupy.zeros(64, np.int32)
empty = SharedPrefix(z(), z(), cupy.zeros(512, np.int32))
sargs, _ = case(128)
sizes = np.zeros(64, np.int32); sizes[::8] = 8
groups = SharedPrefix(cupy.full(64, 128, np.int32), cupy.asarray(sizes), cupy.zeros(512, np.int32))
for _ in range(2):
    cuda.paged_attention(*args); cuda.paged_attention(*args, shared_prefix=empty); cuda.paged_attention(*sargs, shared_prefix=groups)
cupy.cuda.Device().synchronize()
PY
timeout 150 ncu --clock-control none --kernel-name regex:paged_attention_split --launch-skip 3 --launch-count 3 \
  --metrics gpu__time_duration.sum,sm__ctas_launched.max,sm__ctas_launched.min,sm__ctas_launched.sum,sm__cycles_active.max,sm__cycles_active.avg,sm__warps_active.avg.per_cycle_active,dram__bytes_read.sum \
  python3 /tmp/three_attentions.py 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -40
