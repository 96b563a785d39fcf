"""The dropout kernel (LoRA's, training only) against the reference: the very same mask and values."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import DTYPES

from barerl.ops import ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 8), (123, 3072), (513, 136)])
@pytest.mark.parametrize("p", [0.05, 0.5])
def test_dropout_is_the_reference_bit_for_bit(draw, dtype, shape, p):
    import cupy

    from barerl.ops import cuda

    x = draw.normal(shape, dtype)
    out = cuda.dropout(x, p, seed=12345, stream=7)
    want = ref.dropout(cupy.asnumpy(x), p, seed=12345, stream=7)  # NumPy: ml_dtypes rounds to nearest even
    assert out.dtype == dtype
    np.testing.assert_array_equal(cupy.asnumpy(out).view(np.uint8), want.view(np.uint8))
    back = cuda.dropout_backward(x, p, seed=12345, stream=7)
    np.testing.assert_array_equal(cupy.asnumpy(back).view(np.uint8), cupy.asnumpy(out).view(np.uint8))
