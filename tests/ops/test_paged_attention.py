"""paged_attention (ops/cuda/paged_attention.py) against ops.ref.paged_attention.

Ragged context lengths, block tables over shuffled physical blocks (padded with unused entries), GQA groups
1/2/4 (and the tiny test models' head dims), decode (one query per sequence, with and without split-KV) and
prefill (many queries per sequence against a cached prefix). Outputs come from a poisoned memory pool.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from kernel_harness import BF16, DTYPES, FP16, FP32, Draw, assert_close, f32, launcher, poisoned

from barerl.ops import ref

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
    from barerl.ops import cuda

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



# (UNROLL, STAGES) of the kernel's cp.async pipeline that a GPU A/B may set (ops/cuda/paged_attention.py's
# _UNROLL, _STAGES); the first is the default. test_compile.py builds each of them without a GPU.
PIPELINES = [(4, 2), (2, 2), (2, 3), (2, 4), (4, 1), (8, 1), (1, 8), (3, 3)]


@pytest.mark.parametrize("unroll,stages", PIPELINES)
@pytest.mark.parametrize("num_seqs,max_context,prefill", [(3, 1500, False), (70, 300, False), (5, 200, True)])
def test_pipeline_variants(draw, monkeypatch, unroll, stages, num_seqs, max_context, prefill):
    """Every pipeline shape on G1's heads (16 query, 8 kv, head_dim 128): split and whole decode, prefill,
    ragged contexts (rounds cut by a part's end)."""
    paged_attention = launcher("paged_attention")

    monkeypatch.setattr(paged_attention, "_UNROLL", unroll)
    monkeypatch.setattr(paged_attention, "_STAGES", stages)
    batch = make_batch(draw, BF16, num_seqs, 16, 8, 128, max_context, prefill)
    run_and_compare(*batch, BF16)


# ---------------------------------------------------------------------------------------------------------
# batch_invariant=True: a query token's output is bitwise the training attention's row for it.
# Packed sequences go through the training kernel (`attention`); their keys and values are scattered over a
# shuffled paged cache; then each query token asks the paged kernel at its own position, alone (decode: one
# query per sequence) or with the rest of its sequence (prefill against the cache). Every output must equal
# the training kernel's row for the token bit for bit, and the reference's within bf16 tolerance.


def packed_and_paged(draw, dtype, lens, num_heads, num_kv_heads, head_dim, block_size):
    """q, k, v packed by cu_seqlens, and the same keys/values in a paged cache (shuffled blocks)."""
    import cupy

    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(cu[-1])
    q = draw.normal((T, num_heads, head_dim), dtype)
    k = draw.normal((T, num_kv_heads, head_dim), dtype)
    v = draw.normal((T, num_kv_heads, head_dim), dtype)
    blocks = [-(-n // block_size) for n in lens]
    num_blocks = sum(blocks) + 3
    physical = draw.rng.permutation(num_blocks)
    tables = np.zeros((len(lens), max(blocks) + 2), np.int32)  # padding columns the kernel must not read
    k_cache = draw.normal((num_blocks, block_size, num_kv_heads, head_dim), dtype)
    v_cache = draw.normal((num_blocks, block_size, num_kv_heads, head_dim), dtype)
    used = 0
    for s, n in enumerate(lens):
        tables[s, : blocks[s]] = physical[used : used + blocks[s]]
        used += blocks[s]
        for j in range(n):
            block, row = tables[s, j // block_size], j % block_size
            k_cache[block, row] = k[cu[s] + j]
            v_cache[block, row] = v[cu[s] + j]
    return q, k, v, cupy.asarray(cu), k_cache, v_cache, cupy.asarray(tables)


def same_bits(a, b) -> float:
    """Fraction of elements whose bits differ."""
    return float((a.view(np.uint16) != b.view(np.uint16)).mean())


@pytest.fixture(params=["one-warp", "warps"])
def invariant_decode_kernel(request, monkeypatch):
    """Each of the invariant decode's kernels, whatever the number of (sequence, kv head) pairs: one warp a pair,
    or INV_WARPS warps sharing a pair's tiles (cuda/paged_attention.py's _invariant_decode)."""
    paged_attention = importlib.import_module("barerl.ops.cuda.paged_attention")  # the module, not its function
    monkeypatch.setattr(paged_attention, "_INVARIANT_PAIRS_PER_SM", 0 if request.param == "one-warp" else 10**6)
    return request.param


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
@pytest.mark.parametrize("heads", [(16, 8, 128), (8, 2, 64), (4, 4, 64)], ids=lambda h: f"H{h[0]}K{h[1]}D{h[2]}")
def test_invariant_decode_rows_equal_the_training_rows(draw, dtype, heads, invariant_decode_kernel):
    import cupy

    from barerl.ops import cuda

    H, K, D = heads
    lens = [1152, 700, 130, 64, 65, 1, 17]
    q, k, v, cu, k_cache, v_cache, tables = packed_and_paged(draw, dtype, lens, H, K, D, BLOCK_SIZE)
    scale = D**-0.5
    o_train, _ = cuda.attention(q, k, v, cu, scale)
    starts = cu.get()[:-1]
    for positions in ([n - 1 for n in lens], [min(n - 1, p) for n, p in zip(lens, [0, 63, 64, 127, 5, 0, 16])]):
        rows = cupy.asarray([int(s) + p for s, p in zip(starts, positions)])
        contexts = cupy.asarray(np.asarray(positions, np.int32) + 1)
        decode_cu = cupy.arange(len(lens) + 1, dtype=np.int32)
        trap = poisoned((len(lens), H, D), dtype)
        del trap
        out = cuda.paged_attention(q[rows], k_cache, v_cache, tables, contexts, decode_cu, scale, batch_invariant=True)
        assert same_bits(out, o_train[rows]) == 0.0, positions
        want = ref.paged_attention(f32(q[rows]), f32(k_cache), f32(v_cache), tables, contexts, decode_cu, scale)
        assert_close("o", out, want, dtype)


@pytest.mark.parametrize("dtype", [BF16], ids=str)
def test_invariant_prefill_rows_equal_the_training_rows(draw, dtype):
    """Every token of each sequence queried at once against the cache (chunked or prefix-cached prefill)."""
    from barerl.ops import cuda

    lens = [300, 64, 129, 2]
    q, k, v, cu, k_cache, v_cache, tables = packed_and_paged(draw, dtype, lens, 16, 8, 128, BLOCK_SIZE)
    scale = 128**-0.5
    o_train, _ = cuda.attention(q, k, v, cu, scale)
    contexts = cu[1:] - cu[:-1]
    out = cuda.paged_attention(q, k_cache, v_cache, tables, contexts, cu, scale, batch_invariant=True)
    assert same_bits(out, o_train) == 0.0


def test_invariant_strided_q_view_of_a_fused_qkv(draw):
    """q as the engine passes it: a row-strided view of the fused qkv buffer, read in place."""
    import cupy

    from barerl.ops import cuda

    lens = [200, 90]
    q, k, v, cu, k_cache, v_cache, tables = packed_and_paged(draw, BF16, lens, 16, 8, 128, BLOCK_SIZE)
    fused = cupy.concatenate([q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1)], 1)
    q_view = fused[:, : 16 * 128].reshape(-1, 16, 128)
    assert not q_view.flags.c_contiguous
    out = cuda.paged_attention(q_view, k_cache, v_cache, tables, cu[1:] - cu[:-1], cu, 128**-0.5,
                               batch_invariant=True)
    o_train, _ = cuda.attention(q, k, v, cu, 128**-0.5)
    assert same_bits(out, o_train) == 0.0


def prefill_after_prefix(draw, heads, batch_invariant):
    """A step as a continued conversation or chunked prefill makes it: some sequences' last tokens queried
    against their cached prefix (new tokens starting mid-tile and on a tile's edge), decode rows between them.
    Returns the paged kernels' rows, the training forward's same rows and the reference's inputs."""
    import cupy

    from barerl.ops import cuda

    H, K, D = heads
    lens = [1152, 700, 130, 64, 300, 2, 17, 500]
    new = [80, 1, 2, 64, 172, 1, 17, 133]  # first new positions 1072 (mid-tile), 699, 128 (a tile's edge), 0, ..., 367
    # (1072 and 367 start mid-tile and mid-warp: the kernel's blocks start at a warp's first row, 1056 and 352)
    q, k, v, cu, k_cache, v_cache, tables = packed_and_paged(draw, BF16, lens, H, K, D, BLOCK_SIZE)
    scale = D**-0.5
    o_train, _ = cuda.attention(q, k, v, cu, scale)
    starts = cu.get()[:-1]
    rows = cupy.asarray(np.concatenate([np.arange(s + n - m, s + n) for s, n, m in zip(starts, lens, new)]))
    new_cu = cupy.asarray(np.concatenate([[0], np.cumsum(new)]).astype(np.int32))
    contexts = cupy.asarray(np.asarray(lens, np.int32))
    trap = poisoned((len(rows), H, D), BF16)
    del trap
    out = cuda.paged_attention(q[rows], k_cache, v_cache, tables, contexts, new_cu, scale,
                               batch_invariant=batch_invariant)
    return out, o_train[rows], (q[rows], k_cache, v_cache, tables, contexts, new_cu, scale)


@pytest.mark.parametrize("batch_invariant", [True, False], ids=["invariant", "default"])
@pytest.mark.parametrize("heads", [(16, 8, 128), (8, 2, 64)], ids=lambda h: f"H{h[0]}K{h[1]}D{h[2]}")
def test_prefill_after_a_cached_prefix_rows_equal_the_training_rows(draw, heads, batch_invariant):
    """Every row of prefill_after_prefix's step is bitwise its training row, in either setting (the tiled prefill
    kernel and the invariant decode kernel), over several draws (a differing bit is rare: blocks that started at
    the first new token itself differed in one element of ~1e6 for draw 2603530564 on an H100), and the
    reference's within bf16 tolerance."""
    for each in [draw, Draw(2603530564), *(Draw(draw.seed + i) for i in range(1, 4))]:
        out, train, args = prefill_after_prefix(each, heads, batch_invariant)
        assert same_bits(out, train) == 0.0, f"draw {each.seed}"
    q, k_cache, v_cache, tables, contexts, new_cu, scale = args
    want = ref.paged_attention(f32(q), f32(k_cache), f32(v_cache), tables, contexts, new_cu, scale)
    assert_close("o", out, want, BF16)
