"""paged_attention_invariant (kernels/flash_attention.py): bitwise the training attention's rows.

Packed sequences go through the training kernel (`attention`); their keys and values are scattered over a
shuffled paged cache; then each query token asks the paged kernel at its own position, alone (decode: one
query per sequence) or with the rest of its sequence (prefill against the cache). Every output must equal
the training kernel's row for the token bit for bit, and the reference's within bf16 tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import BF16, FP16, assert_close, f32, poisoned

from barerl.backend import ref

pytestmark = pytest.mark.gpu
BLOCK_SIZE = 16


def packed_and_paged(draw, dtype, lens, num_heads, num_kv_heads, head_dim):
    """q, k, v packed by cu_seqlens, and the same keys/values in a paged cache (shuffled blocks)."""
    import cupy

    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(cu[-1])
    q = draw.normal((T, num_heads, head_dim), dtype)
    k = draw.normal((T, num_kv_heads, head_dim), dtype)
    v = draw.normal((T, num_kv_heads, head_dim), dtype)
    blocks = [-(-n // BLOCK_SIZE) for n in lens]
    num_blocks = sum(blocks) + 3
    physical = draw.rng.permutation(num_blocks)
    tables = np.zeros((len(lens), max(blocks) + 2), np.int32)  # padding columns the kernel must not read
    k_cache = draw.normal((num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), dtype)
    v_cache = draw.normal((num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), dtype)
    used = 0
    for s, n in enumerate(lens):
        tables[s, : blocks[s]] = physical[used : used + blocks[s]]
        used += blocks[s]
        for j in range(n):
            block, row = tables[s, j // BLOCK_SIZE], j % BLOCK_SIZE
            k_cache[block, row] = k[cu[s] + j]
            v_cache[block, row] = v[cu[s] + j]
    return q, k, v, cupy.asarray(cu), k_cache, v_cache, cupy.asarray(tables)


def same_bits(a, b) -> float:
    """Fraction of elements whose bits differ."""
    return float((a.view(np.uint16) != b.view(np.uint16)).mean())


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
@pytest.mark.parametrize("heads", [(16, 8, 128), (8, 2, 64), (4, 4, 64)], ids=lambda h: f"H{h[0]}K{h[1]}D{h[2]}")
def test_decode_rows_equal_the_training_rows(draw, dtype, heads):
    import cupy

    from barerl.backend import cuda

    H, K, D = heads
    lens = [1152, 700, 130, 64, 65, 1, 17]
    q, k, v, cu, k_cache, v_cache, tables = packed_and_paged(draw, dtype, lens, H, K, D)
    scale = D**-0.5
    o_train, _ = cuda.attention(q, k, v, cu, scale)
    starts = cu.get()[:-1]
    for positions in ([n - 1 for n in lens], [min(n - 1, p) for n, p in zip(lens, [0, 63, 64, 127, 5, 0, 16])]):
        rows = cupy.asarray([int(s) + p for s, p in zip(starts, positions)])
        contexts = cupy.asarray(np.asarray(positions, np.int32) + 1)
        decode_cu = cupy.arange(len(lens) + 1, dtype=np.int32)
        trap = poisoned((len(lens), H, D), dtype)
        del trap
        out = cuda.paged_attention_invariant(q[rows], k_cache, v_cache, tables, contexts, decode_cu, scale)
        assert same_bits(out, o_train[rows]) == 0.0, positions
        want = ref.paged_attention(f32(q[rows]), f32(k_cache), f32(v_cache), tables, contexts, decode_cu, scale)
        assert_close("o", out, want, dtype)


@pytest.mark.parametrize("dtype", [BF16], ids=str)
def test_prefill_rows_equal_the_training_rows(draw, dtype):
    """Every token of each sequence queried at once against the cache (chunked or prefix-cached prefill)."""
    from barerl.backend import cuda

    lens = [300, 64, 129, 2]
    q, k, v, cu, k_cache, v_cache, tables = packed_and_paged(draw, dtype, lens, 16, 8, 128)
    scale = 128**-0.5
    o_train, _ = cuda.attention(q, k, v, cu, scale)
    contexts = cu[1:] - cu[:-1]
    out = cuda.paged_attention_invariant(q, k_cache, v_cache, tables, contexts, cu, scale)
    assert same_bits(out, o_train) == 0.0


def test_strided_q_view_of_a_fused_qkv(draw):
    """q as the engine passes it: a row-strided view of the fused qkv buffer, read in place."""
    import cupy

    from barerl.backend import cuda

    lens = [200, 90]
    q, k, v, cu, k_cache, v_cache, tables = packed_and_paged(draw, BF16, lens, 16, 8, 128)
    fused = cupy.concatenate([q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1)], 1)
    q_view = fused[:, : 16 * 128].reshape(-1, 16, 128)
    assert not q_view.flags.c_contiguous
    out = cuda.paged_attention_invariant(q_view, k_cache, v_cache, tables, cu[1:] - cu[:-1], cu, 128**-0.5)
    o_train, _ = cuda.attention(q, k, v, cu, 128**-0.5)
    assert same_bits(out, o_train) == 0.0
