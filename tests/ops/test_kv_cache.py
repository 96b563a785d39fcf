"""store_kv (ops/cuda/kv_cache.py) against ops.ref.store_kv: bit-identical caches."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import BF16, DTYPES, FP32, assert_same_bits

from barerl.ops import ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cache_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("src_dtype", ["same", FP32], ids=str)
@pytest.mark.parametrize("shape", [(37, 2, 64), (5, 8, 128), (300, 1, 16)])
def test_store_kv(draw, cache_dtype, src_dtype, shape):
    """k, v are row-strided views of a fused qkv; some slots are -1; untouched slots keep their values."""
    import cupy

    from barerl.ops import cuda

    T, K, D = shape
    src_dtype = cache_dtype if src_dtype == "same" else src_dtype
    num_blocks, block_size = T // 4 + 3, 16
    qkv = draw.normal((T, (2 + 2 * K) * D), src_dtype)
    k = qkv[:, 2 * D:(2 + K) * D].reshape(T, K, D)
    v = qkv[:, (2 + K) * D:].reshape(T, K, D)
    slots = draw.rng.permutation(num_blocks * block_size)[:T].astype(np.int32)
    slots[draw.rng.random(T) < 0.2] = -1
    slots = cupy.asarray(slots)
    k_cache = draw.normal((num_blocks, block_size, K, D), cache_dtype)
    v_cache = draw.normal((num_blocks, block_size, K, D), cache_dtype)
    k_want, v_want = k_cache.copy(), v_cache.copy()
    ref.store_kv(k, v, k_want, v_want, slots)
    cuda.store_kv(k, v, k_cache, v_cache, slots)
    assert_same_bits("k_cache", k_cache, k_want)
    assert_same_bits("v_cache", v_cache, v_want)


def test_store_kv_empty(draw):
    from barerl.ops import cuda

    cache = draw.normal((2, 16, 2, 64), BF16)
    before = cache.copy()
    empty = draw.normal((0, 2, 64), BF16)
    cuda.store_kv(empty, empty, cache, cache, draw.integers((0,), 32))
    assert_same_bits("cache", cache, before)
