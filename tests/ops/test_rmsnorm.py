"""RMSNorm kernels against the reference ops."""

from __future__ import annotations

import pytest
from kernel_harness import DTYPES, FP32, assert_close, f32

from barerl.ops import ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 64), (37, 1024), (1000, 2048), (5, 3, 128)])
@pytest.mark.parametrize("with_residual_grad", [False, True])
def test_rmsnorm(draw, dtype, shape, with_residual_grad):
    from barerl.ops import cuda

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
    residual_grad = draw.normal(shape, dtype) if with_residual_grad else None  # both row paths: C <= 1024, 2048
    dx = cuda.rmsnorm_backward(dy, x, w, rstd, dw, residual_grad)
    dx_ref = ref.rmsnorm_backward(f32(dy), f32(x), f32(w), rstd_ref, dw_ref,
                                  None if residual_grad is None else f32(residual_grad))
    assert_close("dx", dx, dx_ref, dtype)
    assert_close("dw", dw, dw_ref, dtype)
