"""gate_up_swiglu (kernels/gate_up_swiglu.py): the fused decode form against the separate GPU ops and fp32.

Decode batch sizes (1 to 64 rows) at Qwen3-0.6B's shape (24 features a CTA) and a smaller one (16 a CTA),
in both 16-bit dtypes; a row's bits do not depend on the rest of its batch; past 64 rows, and in the
batch-invariant mode, the op is the separate ops' composition bit for bit.
"""

from __future__ import annotations

import pytest
from kernel_harness import BF16, FP16, assert_close, assert_same_bits, f32

from barerl.backend import ref

pytestmark = pytest.mark.gpu
SHAPES = [(1024, 3072), (512, 1536)]  # (hidden, intermediate)


def composed(x, w_gate_up):
    from barerl.backend import cuda

    return cuda.swiglu(cuda.linear(x, w_gate_up))


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
@pytest.mark.parametrize("hidden,inter", SHAPES)
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_fused(draw, dtype, hidden, inter, rows):
    from barerl.backend import cuda
    from barerl.kernels.gate_up_swiglu import fusable

    x, w_gate_up = draw.normal((rows, hidden), dtype), draw.normal((2 * inter, hidden), dtype, hidden**-0.5)
    assert fusable(x, w_gate_up)
    a = cuda.gate_up_swiglu(x, w_gate_up)
    assert a.dtype == dtype and a.shape == (rows, inter)
    assert_close("against the separate ops", a, f32(composed(x, w_gate_up)), dtype)
    assert_close("against fp32", a, ref.gate_up_swiglu(f32(x), f32(w_gate_up)), dtype)


def test_a_row_does_not_depend_on_its_batch(draw):
    from barerl.backend import cuda

    x, w_gate_up = draw.normal((64, 1024), BF16), draw.normal((6144, 1024), BF16, 1 / 32)
    batch = cuda.gate_up_swiglu(x, w_gate_up)
    for rows in (slice(0, 1), slice(17, 40), slice(63, 64)):
        assert_same_bits(f"rows {rows}", cuda.gate_up_swiglu(x[rows], w_gate_up), batch[rows])


def test_composes_past_64_rows_and_when_batch_invariant(draw):
    from barerl.backend import cuda

    w_gate_up = draw.normal((6144, 1024), BF16, 1 / 32)
    x = draw.normal((65, 1024), BF16)
    assert_same_bits("65 rows", cuda.gate_up_swiglu(x, w_gate_up), composed(x, w_gate_up))
    cuda.set_batch_invariant(True)
    try:
        assert_same_bits("batch-invariant", cuda.gate_up_swiglu(x[:8], w_gate_up), composed(x[:8], w_gate_up))
    finally:
        cuda.set_batch_invariant(False)
