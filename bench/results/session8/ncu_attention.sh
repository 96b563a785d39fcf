#!/usr/bin/env bash
# session 8, call 6: what bounds G1's decode attention (64 x 640, distinct blocks)? ncu's speed-of-light, memory and
# warp-state sections for one launch of paged_attention_split.
export PYTHONPATH=$PWD/src:$PWD/bench:$PWD/bench/results/session8 PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p $CUPY_CACHE_DIR && tar -xzf .carry/cupy_cache.tgz -C $CUPY_CACHE_DIR
cat > /tmp/one_attention.py <<'PY'
import cupy
from shared_prefix_attention import case
from barerl.backend import cuda
args, _ = case(0)
for _ in range(3):
    cuda.paged_attention(*args)
cupy.cuda.Device().synchronize()
PY
timeout 150 ncu --clock-control none --kernel-name regex:paged_attention_split --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
  python3 /tmp/one_attention.py 2>&1 | grep -vE "^==PROF==|^\s*$" | tail -80
