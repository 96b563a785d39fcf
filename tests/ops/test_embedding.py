"""Embedding gather / scatter-add kernels against the reference ops."""

from __future__ import annotations

import pytest
from kernel_harness import DTYPES, FP32, assert_close, f32

from barerl.ops import ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 10, 64), (300, 50, 1024), (4097, 151936, 128)])
def test_embedding(draw, dtype, shape):
    from barerl.ops import cuda

    T, V, C = shape
    ids = draw.integers((T,), V)  # small V: many repeated ids, so the scatter-add must really add
    table = draw.normal((V, C), dtype)
    out = cuda.embedding(ids, table)
    assert out.dtype == dtype
    assert_close("out", out, ref.embedding(ids, f32(table)), FP32)  # a gather is exact

    dx = draw.normal((T, C), dtype)
    dtable = draw.normal((V, C), FP32)
    dtable_ref = dtable.copy()
    cuda.embedding_backward(dx, ids, dtable)
    ref.embedding_backward(f32(dx), ids, dtable_ref)
    assert_close("dtable", dtable, dtable_ref, FP32)
