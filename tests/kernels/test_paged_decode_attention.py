"""paged_decode_attention (kernels/paged_attention.py: the split kernel's NEW_TOKEN build, which does
qk_norm_rope_store's work itself) against backend.ref.paged_decode_attention (qk_norm_rope_store, then
paged_attention).

Decode steps over shuffled block tables with ragged contexts, unsplit (many sequences) and split (a few long
ones: only the last split owns the new key), GQA groups 2 and 4, head_dim 64/128, bf16 and fp32, with and without q/k norm
weights, padding rows (slot -1: nothing cached), q, k, v as row-strided views of one fused qkv buffer. Both
the output and the caches afterwards (the new keys and values written at their slots) are compared.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import BF16, FP32, assert_close, f32, poisoned
from test_paged_attention import BLOCK_SIZE, make_batch
from test_qk_norm_rope import _tables

from barerl.backend import ref

pytestmark = pytest.mark.gpu


def decode_step(draw, dtype, num_seqs, heads, head_dim, max_context, norm, padding=0):
    """A decode step's raw fused qkv and everything paged_decode_attention takes; the last `padding` rows
    have slot -1 (a CUDA graph's padding)."""
    import cupy

    H, K = heads
    _, k_cache, v_cache, tables, lens, cu = make_batch(draw, dtype, num_seqs, H, K, head_dim, max_context, False)
    positions = lens - 1
    host_tables, host_pos = cupy.asnumpy(tables), cupy.asnumpy(positions)
    slots = host_tables[np.arange(num_seqs), host_pos // BLOCK_SIZE] * BLOCK_SIZE + host_pos % BLOCK_SIZE
    slots[num_seqs - padding:] = -1
    qkv = draw.normal((num_seqs, (H + 2 * K) * head_dim), dtype)
    q = qkv[:, :H * head_dim].reshape(num_seqs, H, head_dim)
    k = qkv[:, H * head_dim:(H + K) * head_dim].reshape(num_seqs, K, head_dim)
    v = qkv[:, (H + K) * head_dim:].reshape(num_seqs, K, head_dim)
    cos, sin = _tables(max_context + 1, head_dim)
    norms = (draw.normal((head_dim,), dtype, 0.2) + 1, draw.normal((head_dim,), dtype, 0.2) + 1) if norm else (None,) * 2
    return {"q": q, "k": k, "v": v, "positions": positions, "cos": cos, "sin": sin, "q_norm": norms[0],
            "k_norm": norms[1], "eps": 1e-6, "k_cache": k_cache, "v_cache": v_cache,
            "slot_mapping": cupy.asarray(slots.astype(np.int32)), "block_tables": tables, "context_lens": lens,
            "cu_seqlens_q": cu, "scale": head_dim**-0.5}


def check(step, dtype):
    from barerl.backend import cuda

    want_step = {name: f32(x) if hasattr(x, "dtype") and x.dtype.kind == "f" else x for name, x in step.items()}
    want = ref.paged_decode_attention(**want_step)
    trap = poisoned(step["q"].shape, step["q"].dtype)
    del trap
    out = cuda.paged_decode_attention(**step)
    assert out.dtype == step["q"].dtype and out.shape == step["q"].shape
    assert_close("o", out, want, dtype)
    live = step["slot_mapping"] >= 0
    slots = step["slot_mapping"][live]
    for name in ("k_cache", "v_cache"):  # the new rows (the rest was never touched by either)
        rows = step[name].reshape(-1, *step[name].shape[2:])[slots]
        want_rows = want_step[name].reshape(-1, *step[name].shape[2:])[slots]
        assert_close(f"{name} new rows", rows, want_rows, dtype)


@pytest.mark.parametrize("dtype", [BF16, FP32], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(16, 8), (8, 2)])
@pytest.mark.parametrize("num_seqs,max_context", [(70, 300), (3, 1500)], ids=["unsplit", "split"])
@pytest.mark.parametrize("norm", [True, False])
def test_decode(draw, dtype, head_dim, heads, num_seqs, max_context, norm):
    check(decode_step(draw, dtype, num_seqs, heads, head_dim, max_context, norm), dtype)


def test_padding_rows_write_nothing(draw):
    step = decode_step(draw, BF16, 20, (16, 8), 128, 200, True, padding=4)
    before = {name: step[name].copy() for name in ("k_cache", "v_cache")}
    check(step, BF16)
    changed = [(before[name] != step[name]).any(axis=(2, 3)).sum() for name in before]  # (block, row) touched
    assert changed == [16, 16], f"only the 16 live rows' slots may change, got {changed}"


def test_one_key_context(draw):
    """A sequence whose only key is the new one (context 1): no cached key to read at all."""
    import cupy

    step = decode_step(draw, BF16, 8, (16, 8), 128, 64, True)
    step["context_lens"] = cupy.ones_like(step["context_lens"])
    step["positions"] = step["context_lens"] - 1
    tables = cupy.asnumpy(step["block_tables"])
    step["slot_mapping"] = cupy.asarray((tables[:, 0] * BLOCK_SIZE).astype(np.int32))
    check(step, BF16)
