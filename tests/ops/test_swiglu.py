"""SwiGLU kernels against the reference ops."""

from __future__ import annotations

import pytest
from kernel_harness import DTYPES, assert_close, f32

from barerl.ops import ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 8), (123, 3072), (513, 136)])
def test_swiglu(draw, dtype, shape):
    from barerl.ops import cuda

    T, inter = shape
    gate_up = draw.normal((T, 2 * inter), dtype, 2.0)
    a = cuda.swiglu(gate_up)
    assert a.dtype == dtype
    assert_close("a", a, ref.swiglu(f32(gate_up)), dtype)
    da = draw.normal((T, inter), dtype)
    assert_close(
        "dgate_up", cuda.swiglu_backward(da, gate_up), ref.swiglu_backward(f32(da), f32(gate_up)), dtype
    )
