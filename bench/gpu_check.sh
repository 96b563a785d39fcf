#!/usr/bin/env bash
# One device call: kernel tests against the reference, then the kernel micro-benchmarks; logs under $OUT.
# usage (on the GPU machine, repo root): [TESTS="paths"] [SKIP_TESTS=1] [SKIP_BENCH=1] bench/gpu_check.sh [pytest -k expr]
# A tarball of CuPy's kernel cache is written to $OUT and read back from .carry/cupy_cache.tgz when carried,
# so unchanged kernels are not compiled again by the next call.
set -o pipefail
OUT=${OUT:-/tmp/barerl_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache BARERL_ERROR_LOG=$OUT/errors.tsv
mkdir -p "$CUPY_CACHE_DIR"
[ -f .carry/cupy_cache.tgz ] && tar -xzf .carry/cupy_cache.tgz -C "$CUPY_CACHE_DIR"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 | tee -a "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -m gpu ${TESTS:-tests/kernels} -q --maxfail=30 -p no:cacheprovider \
    ${1:+-k "$1"} 2>&1 | tee "$OUT/pytest.log" | grep -v -E "^(SKIPPED|PASSED)"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${BENCH_TIMEOUT:-150}" python3 bench/bench_kernels.py 2>&1 | tee "$OUT/bench.log"
fi
tar -czf "$OUT/cupy_cache.tgz" -C "$CUPY_CACHE_DIR" .
