"""RMSNorm kernels against the reference ops."""

from __future__ import annotations

import pytest
from kernel_harness import DTYPES, FP32, assert_close, f32

from barerl.backend import ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 64), (37, 1024), (1000, 2048), (5, 3, 128)])
def test_rmsnorm(draw, dtype, shape):
    from barerl.backend import cuda

    x = draw.normal(shape, dtype, 3.0)
    w = draw.normal(shape[-1:], dtype)
    y, rstd = cuda.rmsnorm(x, w, 1e-6)
    y_ref, rstd_ref = ref.rmsnorm(f32(x), f32(w), 1e-6)
    assert y.dtype == dtype
    assert_close("y", y, y_ref, dtype)
    assert_close("rstd", rstd, rstd_ref, FP32)

    dy = draw.normal(shape, dtype)
    dw = draw.normal(shape[-1:], FP32)
    dw_ref = dw.copy()
    dx = cuda.rmsnorm_backward(dy, x, w, rstd, dw)
    dx_ref = ref.rmsnorm_backward(f32(dy), f32(x), f32(w), rstd_ref, dw_ref)
    assert_close("dx", dx, dx_ref, dtype)
    assert_close("dw", dw, dw_ref, dtype)
