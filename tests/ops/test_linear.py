"""cuBLAS linear layers (ops/cuda/linear.py, ops/cuda/cublas.py) against the reference ops."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import DTYPES, FP32, assert_close, f32, poison

from barerl.ops import ref

pytestmark = pytest.mark.gpu


DECODE_SHAPES = [(64, 2048, 1000), (256, 1536, 576)]  # decode rows, a K longer than N (o_proj, down)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 64, 32), (77, 200, 136), (512, 1024, 3072), *DECODE_SHAPES])
@pytest.mark.parametrize("epilogue", ["none", "bias", "residual", "both"])
def test_linear(draw, dtype, shape, epilogue):
    from barerl.ops import cuda

    T, K, N = shape
    x, w = draw.normal((T, K), dtype), draw.normal((N, K), dtype, K**-0.5)
    bias = draw.normal((N,), dtype) if epilogue in ("bias", "both") else None
    residual = draw.normal((T, N), dtype) if epilogue in ("residual", "both") else None
    out = cuda.linear(x, w, bias, residual)
    want = ref.linear(
        f32(x), f32(w), None if bias is None else f32(bias), None if residual is None else f32(residual)
    )
    assert out.dtype == dtype
    assert_close("y", out, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 48, 40), (300, 256, 520)])
def test_linear_backward(draw, dtype, shape):
    import cupy

    from barerl.ops import cuda

    T, K, N = shape
    dy, x, w = draw.normal((T, N), dtype), draw.normal((T, K), dtype), draw.normal((N, K), dtype)
    dw, db = draw.normal((N, K), FP32), draw.normal((N,), FP32)  # accumulated into: must not be overwritten
    dw_ref, db_ref = dw.copy(), db.copy()
    dx = cuda.linear_backward(dy, x, w, dw, db)
    dx_ref = ref.linear_backward(f32(dy), f32(x), f32(w), dw_ref, db_ref)
    assert dx.dtype == dtype and isinstance(dx, cupy.ndarray)
    assert_close("dx", dx, dx_ref, dtype)
    assert_close("dw", dw, dw_ref, dtype)
    assert_close("dbias", db, db_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_views_and_poison(draw, dtype):
    """A GEMM on row-strided views (the q part of a fused qkv) writes every element of a poisoned out."""
    from barerl.ops.cuda.cublas import gemm

    qkv = draw.normal((70, 3 * 64), dtype)
    w = draw.normal((96, 64), dtype)
    out = qkv[:, :96].copy()
    poison(out)
    gemm(qkv[:, 64:128], w, out, transb=True)
    assert_close("view gemm", out, f32(qkv[:, 64:128]) @ f32(w).T, dtype)


@pytest.mark.parametrize("offset", [0, 1, 8])
def test_cublaslt_on_misaligned_views_and_accumulation(draw, offset):
    """cuBLASLt products on views starting `offset` elements into their buffers (the plan asks for algorithms
    that accept the pointers' alignment), with a bias epilogue, and fp32 accumulation into out (beta = 1)."""
    import cupy

    from barerl.ops.cuda.cublaslt import matmul

    dtype = DTYPES[0]
    x = draw.normal((37 * 72 + offset,), dtype)[offset:].reshape(37, 72)
    w = draw.normal((50 * 72 + offset,), dtype)[offset:].reshape(50, 72)
    bias, residual = draw.normal((50,), dtype), draw.normal((37, 50), dtype)
    out = cupy.empty((37, 50), dtype)
    poison(out)
    matmul(x, w, out, transb=True, beta=1.0, c=residual, bias=bias)
    assert_close("x w^T + residual + bias", out, f32(x) @ f32(w).T + f32(residual) + f32(bias), dtype)
    acc = draw.normal((72, 72), FP32)
    want = acc + f32(x).T @ f32(x)
    matmul(x, x, acc, transa=True, beta=1.0)
    assert_close("acc += x^T x", acc, want, dtype)


def test_lm_head_logits(draw):
    from barerl.ops import cuda

    h, w = draw.normal((5, 128), np.dtype("float32")), draw.normal((1000, 128), np.dtype("float32"))
    assert_close("logits", cuda.lm_head_logits(h, w, 0.7), ref.lm_head_logits(h, w, 0.7), FP32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 48, 40), (300, 256, 16)])
def test_scaled_linear_and_its_backward_with_a_frozen_weight(draw, dtype, shape):
    """LoRA's products: the scale as alpha, dx's extra gradient as the C operand, and dw None (no dW product)."""
    from barerl.ops import cuda

    T, K, N = shape
    x, w, residual = draw.normal((T, K), dtype), draw.normal((N, K), dtype, K**-0.5), draw.normal((T, N), dtype)
    assert_close("y", cuda.linear(x, w, residual=residual, scale=0.37),
                 ref.linear(f32(x), f32(w), residual=f32(residual), scale=0.37), dtype)
    dy, extra = draw.normal((T, N), dtype), draw.normal((T, K), dtype)
    dw = draw.normal((N, K), FP32)
    dw_ref = dw.copy()
    dx = cuda.linear_backward(dy, x, w, dw, scale=2.5, residual_grad=extra)
    assert_close("dx", dx, ref.linear_backward(f32(dy), f32(x), f32(w), dw_ref, scale=2.5,
                                               residual_grad=f32(extra)), dtype)
    assert_close("dw", dw, dw_ref, dtype)
    frozen = cuda.linear_backward(dy, x, w, None)
    assert_close("dx, frozen w", frozen, ref.linear_backward(f32(dy), f32(x), f32(w), None), dtype)
