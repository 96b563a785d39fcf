"""mlp (kernels/mlp_decode.py): the fused decode MLP against the separate GPU ops and the fp32 reference.

Decode batch sizes (1 to 64 rows) at Qwen3-0.6B's shape and a small one, in both 16-bit dtypes; a row's
bits do not depend on the rest of its batch; past 64 rows, and in the batch-invariant mode, `mlp` is the
separate ops' composition bit for bit.
"""

from __future__ import annotations

import pytest
from kernel_harness import BF16, FP16, assert_close, assert_same_bits, f32

from barerl.backend import ref

pytestmark = pytest.mark.gpu
SHAPES = [(1024, 3072), (512, 1024)]  # (hidden, intermediate)


def weights(draw, hidden, inter, dtype):
    return (draw.normal((2 * inter, hidden), dtype, hidden**-0.5), draw.normal((hidden, inter), dtype, inter**-0.5))


def composed(x, w_gate_up, w_down, residual):
    from barerl.backend import cuda

    return cuda.linear(cuda.swiglu(cuda.linear(x, w_gate_up)), w_down, residual=residual)


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_fused_mlp(draw, dtype, hidden, inter, rows):
    from barerl.backend import cuda
    from barerl.kernels.mlp_decode import fusable

    x, residual = draw.normal((rows, hidden), dtype), draw.normal((rows, hidden), dtype)
    w_gate_up, w_down = weights(draw, hidden, inter, dtype)
    assert fusable(x, w_gate_up, w_down)
    out = cuda.mlp(x, w_gate_up, w_down, residual)
    assert out.dtype == dtype and out.shape == (rows, hidden)
    assert_close("against the separate ops", out, f32(composed(x, w_gate_up, w_down, residual)), dtype)
    assert_close("against fp32", out, ref.mlp(f32(x), f32(w_gate_up), f32(w_down), f32(residual)), dtype)


def test_a_row_does_not_depend_on_its_batch(draw):
    from barerl.backend import cuda

    x, residual = draw.normal((64, 1024), BF16), draw.normal((64, 1024), BF16)
    w_gate_up, w_down = weights(draw, 1024, 3072, BF16)
    batch = cuda.mlp(x, w_gate_up, w_down, residual)
    for rows in (slice(0, 1), slice(17, 40), slice(63, 64)):
        assert_same_bits(f"rows {rows}", cuda.mlp(x[rows], w_gate_up, w_down, residual[rows]), batch[rows])


def test_composes_past_64_rows_and_when_batch_invariant(draw):
    from barerl.backend import cuda

    w_gate_up, w_down = weights(draw, 1024, 3072, BF16)
    x, residual = draw.normal((65, 1024), BF16), draw.normal((65, 1024), BF16)
    assert_same_bits("65 rows", cuda.mlp(x, w_gate_up, w_down, residual), composed(x, w_gate_up, w_down, residual))
    x, residual = x[:8], residual[:8]
    cuda.set_batch_invariant(True)
    try:
        invariant = cuda.mlp(x, w_gate_up, w_down, residual)
        assert_same_bits("batch-invariant", invariant, composed(x, w_gate_up, w_down, residual))
    finally:
        cuda.set_batch_invariant(False)
