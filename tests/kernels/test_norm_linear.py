"""The fused norm + product kernels (kernels/norm_linear.py) against their reference twins."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import BF16, FP16, FP32, assert_close, f32, poison

from barerl.backend import ref

pytestmark = pytest.mark.gpu

# (rows, K, N): G1's qkv and one row of it, Qwen2.5-0.5B's qkv (K 896, with bias), the tiny test models'
SHAPES = [(64, 1024, 4096), (1, 1024, 4096), (37, 896, 1152), (5, 128, 512)]
SWIGLU_SHAPES = [(64, 1024, 6144), (3, 1024, 6144), (64, 896, 9728), (9, 128, 512)]


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """cupy.empty hands out NaN-filled arrays, so an output element the kernel skips fails the comparison."""
    import cupy

    empty = cupy.empty

    def nan_filled(shape, dtype=float, *args, **kwargs):
        out = empty(shape, dtype, *args, **kwargs)
        if out.dtype.itemsize in (2, 4) and out.dtype.kind == "f":
            poison(out)
        return out

    monkeypatch.setattr(cupy, "empty", nan_filled)


def inputs(draw, dtype, rows, k_dim, n):
    x = draw.normal((rows, k_dim), dtype, 3.0)  # unnormalised, as the residual stream
    g = draw.normal((k_dim,), dtype)
    w = draw.normal((n, k_dim), dtype, k_dim**-0.5)
    return x, g, w


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
@pytest.mark.parametrize("shape", SHAPES)
def test_rmsnorm_linear(draw, poisoned_outputs, dtype, shape):
    from barerl.backend import cuda
    from barerl.kernels import norm_linear

    x, g, w = inputs(draw, dtype, *shape)
    bias = draw.normal((shape[2],), dtype)
    assert norm_linear._weight_rows(x, w, swiglu=False) is not None  # the kernel, not the unfused fallback
    for b in (None, bias):
        out = cuda.rmsnorm_linear(x, g, 1e-6, w, b)
        want = ref.rmsnorm_linear(f32(x), f32(g), 1e-6, f32(w), None if b is None else f32(b))
        assert out.dtype == dtype and out.shape == want.shape
        assert_close("y", out, want, dtype)


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
@pytest.mark.parametrize("shape", SWIGLU_SHAPES)
def test_rmsnorm_linear_swiglu(draw, poisoned_outputs, dtype, shape):
    from barerl.backend import cuda
    from barerl.kernels import norm_linear

    x, g, w = inputs(draw, dtype, *shape)
    assert norm_linear._weight_rows(x, w, swiglu=True) is not None
    out = cuda.rmsnorm_linear_swiglu(x, g, 1e-6, w)
    want = ref.rmsnorm_linear_swiglu(f32(x), f32(g), 1e-6, f32(w))
    assert out.dtype == dtype and out.shape == want.shape
    assert_close("act", out, want, dtype)


@pytest.mark.parametrize("swiglu", [False, True])
def test_row_tiles_past_the_first(draw, poisoned_outputs, monkeypatch, swiglu):
    """More than 64 rows: the kernel walks row tiles with the weight tile kept (a partial last tile)."""
    from barerl.backend import cuda
    from barerl.kernels import norm_linear

    monkeypatch.setattr(norm_linear, "MAX_ROWS", 256)
    x, g, w = inputs(draw, BF16, 150, 1024, 6144 if swiglu else 4096)
    op, twin = ((cuda.rmsnorm_linear_swiglu, ref.rmsnorm_linear_swiglu) if swiglu
                else (cuda.rmsnorm_linear, ref.rmsnorm_linear))
    assert_close("out", op(x, g, 1e-6, w), twin(f32(x), f32(g), 1e-6, f32(w)), BF16)


@pytest.mark.parametrize("case", ["fp32", "many rows", "K not a multiple of 128"])
def test_shapes_the_kernel_does_not_take_run_unfused(draw, case):
    from barerl.backend import cuda
    from barerl.kernels import norm_linear

    dtype, rows, k_dim = {"fp32": (FP32, 8, 1024), "many rows": (BF16, 300, 1024),
                          "K not a multiple of 128": (BF16, 8, 192)}[case]
    x, g, w = inputs(draw, dtype, rows, k_dim, 512)
    assert norm_linear._weight_rows(x, w, swiglu=False) is None
    assert_close("y", cuda.rmsnorm_linear(x, g, 1e-6, w), ref.rmsnorm_linear(f32(x), f32(g), 1e-6, f32(w)), dtype)
    assert_close("act", cuda.rmsnorm_linear_swiglu(x, g, 1e-6, w),
                 ref.rmsnorm_linear_swiglu(f32(x), f32(g), 1e-6, f32(w)), dtype)


def test_inside_a_cuda_graph(draw):
    """Captured once, replayed on new inputs written in place (as the engine's decode graphs run it)."""
    import cupy

    from barerl.backend import cuda

    x, g, w = inputs(draw, BF16, 64, 1024, 6144)
    cuda.rmsnorm_linear_swiglu(x, g, 1e-6, w)  # compile outside the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = cuda.rmsnorm_linear_swiglu(x, g, 1e-6, w)
        graph = stream.end_capture()
    x[...] = draw.normal(x.shape, BF16, 3.0)
    graph.launch(stream)
    stream.synchronize()
    assert_close("act", out, ref.rmsnorm_linear_swiglu(f32(x), f32(g), 1e-6, f32(w)), BF16)
    assert np.isfinite(cupy.asnumpy(out).astype(np.float32)).all()
