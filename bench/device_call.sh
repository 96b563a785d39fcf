# Sourced by a device call's script (bench/results/sessionN/*.sh): the environment, CuPy's kernel cache and
# cuBLASLt's tuning from .carry (when carried), the GPU's name and clocks, a logs folder $L under $OUT, and
#   t NAME SECONDS COMMAND...   one timed step (prints its start, exit status and seconds)
#   finish                      logs (and the kernel cache, for the next call's carry) tarred under $OUT
set -o pipefail
export OUT=${OUT:-/tmp/out} PYTHONPATH=$PWD/src:$PWD/bench PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/cupy_cache
mkdir -p "$CUPY_CACHE_DIR" "$HOME/.cache/barerl"
[ -f .carry/cupy_cache.tgz ] && tar -xzf .carry/cupy_cache.tgz -C "$CUPY_CACHE_DIR"
cp .carry/cublaslt-*.json "$HOME/.cache/barerl/" 2>/dev/null
L=$OUT/logs; rm -rf "$L"; mkdir -p "$L"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; date -u; } > "$L/gpu.txt"  # the commit: in RESULTS (the copy's git metadata lags)
t() { local s=$SECONDS; echo "=== $1 ($(date -u +%T))"; shift; timeout "$@"; echo "--- rc=$? $((SECONDS - s)) s"; }
finish() { tar -czf "$OUT/cupy_cache.tgz" -C "$CUPY_CACHE_DIR" .; tar -czf "$OUT/logs.tgz" -C "$OUT" logs; }
