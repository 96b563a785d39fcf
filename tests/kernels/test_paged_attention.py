"""paged_attention (kernels/paged_attention.py) against backend.ref.paged_attention.

Ragged context lengths, block tables over shuffled physical blocks (padded with unused entries), GQA groups
1/2/4 (and the tiny test models' head dims), decode (one query per sequence, with and without split-KV) and
prefill (many queries per sequence against a cached prefix). Outputs come from a poisoned memory pool.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import BF16, DTYPES, FP32, assert_close, f32, poisoned

from barerl.backend import ref

pytestmark = pytest.mark.gpu
BLOCK_SIZE = 16


def make_batch(draw, dtype, num_seqs, num_heads, num_kv_heads, head_dim, max_context, prefill,
               block_size=BLOCK_SIZE):
    """Random q, caches, shuffled block tables; returns the op's arguments (cu_seqlens_q last but scale)."""
    import cupy

    rng = draw.rng
    contexts = rng.integers(1, max_context + 1, num_seqs)
    contexts[0] = max_context  # the longest context sets the widest table row
    new = rng.integers(1, np.minimum(contexts, 40) + 1) if prefill else np.ones(num_seqs, np.int64)
    if prefill:
        new[-1] = contexts[-1]  # one sequence with no cached prefix
    blocks_per_seq = -(-contexts // block_size)
    num_blocks = int(blocks_per_seq.sum()) + 5
    physical = rng.permutation(num_blocks)
    max_blocks = int(blocks_per_seq.max()) + 3  # padding columns the kernel must never read
    tables = rng.integers(0, num_blocks, (num_seqs, max_blocks)).astype(np.int32)
    start = 0
    for s, n in enumerate(blocks_per_seq):
        tables[s, :n] = physical[start:start + n]
        start += n
    cu = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    q = draw.normal((int(cu[-1]), num_heads, head_dim), dtype)
    k_cache = draw.normal((num_blocks, block_size, num_kv_heads, head_dim), dtype)
    v_cache = draw.normal((num_blocks, block_size, num_kv_heads, head_dim), dtype)
    lens = cupy.asarray(contexts.astype(np.int32))
    return q, k_cache, v_cache, cupy.asarray(tables), lens, cupy.asarray(cu)


def run_and_compare(q, k_cache, v_cache, tables, contexts, cu, dtype):
    from barerl.backend import cuda

    scale = q.shape[-1] ** -0.5
    trap = poisoned(q.shape, q.dtype)  # freed to the pool: the op's output most likely lands on the NaNs
    del trap
    out = cuda.paged_attention(q, k_cache, v_cache, tables, contexts, cu, scale)
    want = ref.paged_attention(f32(q), f32(k_cache), f32(v_cache), tables, contexts, cu, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert_close("o", out, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("num_seqs,max_context", [(3, 1500), (70, 300)])
def test_decode(draw, dtype, head_dim, group, num_seqs, max_context):
    """3 sequences split their keys over many CTAs; 70 x 8 kv heads fill the GPU with one part each."""
    num_kv_heads = 8 if num_seqs > 8 else 2
    heads = num_kv_heads * group
    batch = make_batch(draw, dtype, num_seqs, heads, num_kv_heads, head_dim, max_context, False)
    run_and_compare(*batch, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4])
def test_prefill(draw, dtype, head_dim, group):
    batch = make_batch(draw, dtype, 5, 2 * group, 2, head_dim, 200, True)
    run_and_compare(*batch, dtype)


SMALL_AND_WIDE = [(32, 2, FP32), (16, 4, FP32), (32, 2, BF16), (128, 8, BF16)]


@pytest.mark.parametrize("head_dim,group,dtype", SMALL_AND_WIDE)
@pytest.mark.parametrize("prefill", [False, True])
def test_small_head_dims_and_wide_groups(draw, head_dim, group, dtype, prefill):
    """The tiny test models' shapes (head_dim 16/32) and 8 query heads per kv head."""
    batch = make_batch(draw, dtype, 4, group, 1, head_dim, 100, prefill)
    run_and_compare(*batch, dtype)


@pytest.mark.parametrize("block_size", [1, 5, 8, 32])
@pytest.mark.parametrize("num_seqs,max_context,prefill", [(3, 700, False), (40, 200, False), (5, 200, True)])
def test_block_sizes(draw, block_size, num_seqs, max_context, prefill):
    """Block sizes the default 4-token runs divide (8, 32: one table lookup a run) and do not (1, 5)."""
    batch = make_batch(draw, BF16, num_seqs, 16, 8, 128, max_context, prefill, block_size)
    run_and_compare(*batch, BF16)


def test_fp32_queries_on_bf16_cache(draw):
    q, k_cache, v_cache, tables, contexts, cu = make_batch(draw, BF16, 6, 4, 2, 128, 500, False)
    run_and_compare(q.astype(np.float32), k_cache, v_cache, tables, contexts, cu, BF16)


@pytest.mark.parametrize("prefill", [False, True])
def test_q_view_of_fused_qkv(draw, prefill):
    """q as the model passes it: the row-strided (T, H, D) view of a (T, (H + 2K) D) qkv buffer."""
    q, k_cache, v_cache, tables, contexts, cu = make_batch(draw, BF16, 6, 8, 2, 128, 300, prefill)
    T, H, D = q.shape
    qkv = draw.normal((T, (H + 4) * D), BF16)
    view = qkv[:, :H * D].reshape(T, H, D)
    view[...] = q
    assert not view.flags.c_contiguous
    run_and_compare(view, k_cache, v_cache, tables, contexts, cu, BF16)



# (UNROLL, STAGES) of the kernel's cp.async pipeline that a GPU A/B may set (kernels/paged_attention.py's
# _UNROLL, _STAGES); the first is the default. test_compile.py builds each of them without a GPU.
PIPELINES = [(4, 2), (2, 2), (2, 3), (2, 4), (4, 1), (8, 1), (1, 8), (3, 3)]


@pytest.mark.parametrize("unroll,stages", PIPELINES)
@pytest.mark.parametrize("num_seqs,max_context,prefill", [(3, 1500, False), (70, 300, False), (5, 200, True)])
def test_pipeline_variants(draw, monkeypatch, unroll, stages, num_seqs, max_context, prefill):
    """Every pipeline shape on G1's heads (16 query, 8 kv, head_dim 128): split and whole decode, prefill,
    ragged contexts (rounds cut by a part's end)."""
    from barerl.kernels import paged_attention

    monkeypatch.setattr(paged_attention, "_UNROLL", unroll)
    monkeypatch.setattr(paged_attention, "_STAGES", stages)
    batch = make_batch(draw, BF16, num_seqs, 16, 8, 128, max_context, prefill)
    run_and_compare(*batch, BF16)
