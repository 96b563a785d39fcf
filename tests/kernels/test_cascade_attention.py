"""Cascade decode attention (kernels/cascade_attention.py) against backend.ref.paged_attention.

Decode steps whose sequences come in groups sharing their first physical blocks (GRPO's samples of one
prompt): groups of 1..MAX_SHARED_PREFIX_MEMBERS members, prefixes that end inside a block or fill it, a member
whose own keys are none, ragged contexts, with and without split-KV (few long sequences: several split parts
plus the prefix's), 1..8 query heads per kv head, head_dim 64 and 128, q as the fused qkv's view, eager and
in a CUDA graph. The statement is checked by the reference first, the output comes from a poisoned pool, and
the arrival counts must be zero again after every call.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import BF16, FP16, assert_close, f32, poisoned

from barerl.backend import ref

pytestmark = pytest.mark.gpu
BLOCK_SIZE = 16


def shared_batch(draw, dtype, groups, num_heads, num_kv_heads, head_dim, max_own):
    """groups: (members, prefix length) pairs. Each group's prefix lives in blocks shared by its members'
    tables; each member then has 0..max_own keys of its own in blocks of its own. Returns the op's arguments
    and the SharedPrefix (arrivals zeros)."""
    import cupy

    rng = draw.rng
    tables_rows, contexts, lens, sizes = [], [], [], []
    next_block = 0
    for members, prefix in groups:
        shared = list(range(next_block, next_block + -(-prefix // BLOCK_SIZE)))
        next_block += len(shared)
        full = len(shared) * BLOCK_SIZE  # the last shared block's rows past the prefix are shared too
        for i in range(members):
            # member 0 of a group has no keys of its own (an empty part); a lone sequence has at least one key
            context = prefix if i == 0 and prefix else prefix + int(rng.integers(1, max_own + 1))
            own = -(-(context - full) // BLOCK_SIZE) if context > full else 0
            tables_rows.append(shared + list(range(next_block, next_block + own)))
            next_block += own
            contexts.append(context)
            lens.append(prefix if members > 1 else 0)
            sizes.append(members if i == 0 and members > 1 else 0)
    num_blocks = next_block + 3
    physical = rng.permutation(num_blocks)  # shuffled physical blocks
    max_blocks = max(len(r) for r in tables_rows) + 2  # padding columns the kernels must never read
    tables = rng.integers(0, num_blocks, (len(tables_rows), max_blocks)).astype(np.int32)
    for s, row in enumerate(tables_rows):
        tables[s, :len(row)] = physical[row]
    S = len(contexts)
    q = draw.normal((S, num_heads, head_dim), dtype)
    k_cache = draw.normal((num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), dtype)
    v_cache = draw.normal((num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), dtype)
    shared = ref.SharedPrefix(cupy.asarray(np.int32(lens)), cupy.asarray(np.int32(sizes)),
                              cupy.zeros(S * num_kv_heads, np.int32))
    args = (q, k_cache, v_cache, cupy.asarray(tables), cupy.asarray(np.int32(contexts)),
            cupy.arange(S + 1, dtype=np.int32), head_dim**-0.5)
    return args, shared


def check(args, shared, dtype):
    from barerl.backend import cuda

    q, k_cache, v_cache, tables, contexts, cu, scale = args
    want = ref.paged_attention(f32(q), f32(k_cache), f32(v_cache), tables, contexts, cu, scale, shared)
    trap = poisoned(q.shape, q.dtype)  # freed to the pool: the op's output most likely lands on the NaNs
    del trap
    out = cuda.paged_attention(*args, shared_prefix=shared)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert_close("o", out, want, dtype)
    assert not shared.arrivals.any(), "the arrival counts are not zero after the call"
    return out


# (members, prefix) per group: G1's 8 x 8 samples of a 128-token prompt, smaller groups, prefixes ending
# inside a block, single sequences (no group)
GROUPS_G1 = [(8, 128)] * 8
GROUPS_MIXED = [(8, 128), (3, 100), (1, 0), (5, 64), (2, 200), (1, 0), (8, 70)]


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("groups", [GROUPS_G1, GROUPS_MIXED], ids=["g1", "mixed"])
def test_decode_groups(draw, dtype, head_dim, groups):
    args, shared = shared_batch(draw, dtype, groups, 16, 8, head_dim, max_own=600)
    check(args, shared, dtype)


@pytest.mark.parametrize("group", [1, 4, 8])
def test_query_heads_per_kv_head(draw, group):
    args, shared = shared_batch(draw, BF16, [(8, 144), (5, 96), (1, 0)], 2 * group, 2, 128, 300)
    check(args, shared, BF16)


def test_split_parts_and_prefix(draw):
    """Few long sequences: the split kernel cuts each one's own keys into several parts, and the prefix adds
    one more; the last CTA of each (token, kv head) merges them all."""
    from barerl.kernels.paged_attention import num_splits

    args, shared = shared_batch(draw, BF16, [(2, 512), (2, 64)], 16, 8, 128, max_own=2000)
    assert num_splits(4, 8, args[3].shape[1] * BLOCK_SIZE) > 1
    check(args, shared, BF16)


def test_same_as_without_sharing(draw):
    """The cascade is the same math: against the kernel that reads every key of every sequence."""
    from barerl.backend import cuda

    args, shared = shared_batch(draw, BF16, GROUPS_MIXED, 16, 8, 128, max_own=400)
    out = check(args, shared, BF16)
    assert_close("o vs no sharing", out, cuda.paged_attention(*args), BF16)


def test_q_view_of_fused_qkv(draw):
    args, shared = shared_batch(draw, BF16, GROUPS_MIXED, 16, 8, 128, max_own=300)
    q = args[0]
    T, H, D = q.shape
    qkv = draw.normal((T, (H + 16) * D), BF16)
    view = qkv[:, :H * D].reshape(T, H, D)
    view[...] = q
    assert not view.flags.c_contiguous
    check((view, *args[1:]), shared, BF16)


def test_cuda_graph_replay(draw):
    """Captured and replayed: the output of eager calls, and arrivals zero after each replay."""
    import cupy

    from barerl.backend import cuda

    args, shared = shared_batch(draw, BF16, GROUPS_G1, 16, 8, 128, max_own=600)
    eager = cuda.paged_attention(*args, shared_prefix=shared)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        cuda.paged_attention(*args, shared_prefix=shared)  # warm-up on the capturing stream
        stream.synchronize()
        stream.begin_capture()
        out = cuda.paged_attention(*args, shared_prefix=shared)
        graph = stream.end_capture()
        for _ in range(3):
            out.fill(0)
            graph.launch(stream)
            stream.synchronize()
            assert cupy.array_equal(out, eager)
            assert not shared.arrivals.any()
