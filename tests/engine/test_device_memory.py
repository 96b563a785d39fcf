"""RemappableBuffer (engine/device_memory.py): device memory at a fixed address, released and mapped again."""

import numpy as np
import pytest

SPIN_THEN_WRITE = r"""
extern "C" __global__ void spin_then_write(float* x, long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
    x[threadIdx.x] = 1.0f;
}
"""


@pytest.mark.gpu
def test_a_buffer_dropped_under_queued_work_outlives_it():
    """The engine's last fill of its cache may still be queued when the runner is dropped: unmapping the memory
    under it faulted it with an illegal address, reported by whatever synchronised next (another test)."""
    cupy = pytest.importorskip("cupy", reason="needs cupy and a CUDA GPU")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("needs a CUDA GPU")
    from barerl.engine.device_memory import RemappableBuffer

    buffer = RemappableBuffer.create(1 << 20)
    if buffer is None:
        pytest.skip("this driver reserves no virtual addresses")
    buffer.map()
    x = buffer.array((1 << 18,), np.float32)
    x.fill(0)
    spin = cupy.RawKernel(SPIN_THEN_WRITE, "spin_then_write")
    spin((1,), (32,), (x, np.int64(200_000_000)))  # ~0.1 s of clock: still running when the buffer goes
    del x, buffer
    cupy.cuda.Device().synchronize()  # raises if the kernel met unmapped memory
