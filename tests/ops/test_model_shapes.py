"""Kernels at the shapes of Qwen3-1.7B, -4B and -8B (16 or 32 query heads on 8 kv heads, hidden 2048 / 2560 /
4096, intermediate 6144 / 9728 / 12288) and at 16K positions (workload L1: 256 + 16,384 tokens), against the
reference ops; the other kernel tests run Qwen3-0.6B's shapes and the tiny test models'.

bf16 throughout, as the workloads run. The long sequences are few and the rows of products a decode step's and a
micro-batch's slice, so the whole file runs in about a minute on an H200 (the reference attention walks query
chunks: it never holds a 16K x 16K score matrix per head).
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import BF16, FP32, assert_close, cu_seqlens, f32
from test_paged_attention import BLOCK_SIZE, make_batch, packed_and_paged, run_and_compare, same_bits

from barerl.config import ModelConfig
from barerl.model.rope import rope_tables
from barerl.ops import ref

pytestmark = pytest.mark.gpu

# hidden, query heads, kv heads, intermediate: config.json of each model (head_dim 128, vocab 151,936)
SHAPES = {"qwen3-1.7b": (2048, 16, 8, 6144), "qwen3-4b": (2560, 32, 8, 9728), "qwen3-8b": (4096, 32, 8, 12288)}
HEADS = {"H16K8": (16, 8), "H32K8": (32, 8)}
LONG = 256 + 16384
D = 128


@pytest.mark.parametrize("shape", list(SHAPES))
def test_rmsnorm_at_model_widths(draw, shape):
    """Rows longer than the register-held 1,024 of Qwen3-0.6B take the kernel's looped path."""
    from barerl.ops import cuda

    C = SHAPES[shape][0]
    x, w = draw.normal((300, C), BF16, 3.0), draw.normal((C,), BF16)
    y, rstd = cuda.rmsnorm(x, w, 1e-6)
    y_ref, rstd_ref = ref.rmsnorm(f32(x), f32(w), 1e-6)
    assert_close("y", y, y_ref, BF16)
    assert_close("rstd", rstd, rstd_ref, FP32)
    dy, residual_grad, dw = draw.normal((300, C), BF16), draw.normal((300, C), BF16), draw.normal((C,), FP32)
    dw_ref = dw.copy()
    dx = cuda.rmsnorm_backward(dy, x, w, rstd, dw, residual_grad)
    dx_ref = ref.rmsnorm_backward(f32(dy), f32(x), f32(w), rstd_ref, dw_ref, f32(residual_grad))
    assert_close("dx", dx, dx_ref, BF16)
    assert_close("dw", dw, dw_ref, BF16)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_swiglu_at_model_widths(draw, shape):
    from barerl.ops import cuda

    inter = SHAPES[shape][3]
    gate_up, da = draw.normal((300, 2 * inter), BF16, 2.0), draw.normal((300, inter), BF16)
    assert_close("a", cuda.swiglu(gate_up), ref.swiglu(f32(gate_up)), BF16)
    assert_close("dgate_up", cuda.swiglu_backward(da, gate_up), ref.swiglu_backward(f32(da), f32(gate_up)), BF16)


def _products(shape: str):
    """(name, in features, out features, residual) of a layer's four products."""
    C, H, K, inter = SHAPES[shape]
    return [("qkv", C, (H + 2 * K) * D, False), ("o_proj", H * D, C, True), ("gate_up", C, 2 * inter, False),
            ("down", inter, C, True)]


@pytest.mark.parametrize("rows", [64, 1000])  # a decode step of G3 / R3's 64 sequences; part of a micro-batch
@pytest.mark.parametrize("shape", list(SHAPES))
def test_products_at_model_shapes(draw, shape, rows):
    from barerl.ops import cuda

    for name, K, N, residual in _products(shape):
        x, w = draw.normal((rows, K), BF16), draw.normal((N, K), BF16, K**-0.5)
        res = draw.normal((rows, N), BF16) if residual else None
        out = cuda.linear(x, w, None, res)
        assert_close(f"{name} y", out, ref.linear(f32(x), f32(w), None, None if res is None else f32(res)), BF16)
        if rows < 1000:
            continue  # decode products have no backward
        dy, dw = draw.normal((rows, N), BF16), draw.normal((N, K), FP32)
        dw_ref = dw.copy()
        dx = cuda.linear_backward(dy, x, w, dw)
        assert_close(f"{name} dx", dx, ref.linear_backward(f32(dy), f32(x), f32(w), dw_ref), BF16)
        assert_close(f"{name} dw", dw, dw_ref, BF16)


@pytest.mark.parametrize("heads", list(HEADS))
def test_qk_norm_rope_at_16k_positions(draw, heads):
    """Positions across L1's whole 16,640-token sequences, with the model's own rope tables (theta 1e6)."""
    from barerl.ops import cuda

    H, K = HEADS[heads]
    cfg = ModelConfig.from_dict({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 8, "hidden_size": 2048,
                                 "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": H,
                                 "num_key_value_heads": K, "head_dim": D, "rope_theta": 1e6})
    import cupy

    cos, sin = (cupy.asarray(t) for t in rope_tables(cfg, LONG))
    positions = draw.integers((500,), LONG)
    positions[-1] = LONG - 1
    qkv = draw.normal((500, (H + 2 * K) * D), BF16, 2.0)
    qn, kn = draw.normal((D,), BF16), draw.normal((D,), BF16)
    out, q_rstd, k_rstd = cuda.qk_norm_rope(qkv, positions, cos, sin, H, K, qn, kn, 1e-6)
    out_ref, q_rstd_ref, k_rstd_ref = ref.qk_norm_rope(f32(qkv), positions, cos, sin, H, K, f32(qn), f32(kn), 1e-6)
    assert_close("out", out, out_ref, BF16)
    dout, dqn, dkn = draw.normal(qkv.shape, BF16), draw.normal((D,), FP32), draw.normal((D,), FP32)
    dqn_ref, dkn_ref = dqn.copy(), dkn.copy()
    dqkv = cuda.qk_norm_rope_backward(dout, qkv, positions, cos, sin, H, K, qn, kn, q_rstd, k_rstd, dqn, dkn)
    dqkv_ref = ref.qk_norm_rope_backward(f32(dout), f32(qkv), positions, cos, sin, H, K, f32(qn), f32(kn),
                                         q_rstd_ref, k_rstd_ref, dqn_ref, dkn_ref)
    assert_close("dqkv", dqkv, dqkv_ref, BF16)
    assert_close("dq_norm", dqn, dqn_ref, BF16)


@pytest.mark.parametrize("heads", list(HEADS))
def test_attention_over_a_16k_sequence(draw, heads):
    """Training attention, forward and backward, over one L1 sequence and a short one packed after it."""
    from barerl.ops import cuda

    H, K = HEADS[heads]
    cu, _ = cu_seqlens([LONG, 300])
    T = int(cu[-1])
    qkv = draw.normal((T, (H + 2 * K) * D), BF16)
    q, k, v = (qkv[:, a * D : b * D].reshape(T, -1, D) for a, b in ((0, H), (H, H + K), (H + K, H + 2 * K)))
    scale = D**-0.5
    o, lse = cuda.attention(q, k, v, cu, scale)
    o_ref, lse_ref = ref.attention(f32(q), f32(k), f32(v), cu, scale)
    assert_close("o", o, o_ref, BF16)
    assert_close("lse", lse, lse_ref, BF16, 1e-3)
    do = draw.normal((T, H, D), BF16)
    dqkv = cuda.attention_backward(do, q, k, v, o, lse, cu, scale)
    want = ref.attention_backward(f32(do), f32(q), f32(k), f32(v), f32(o), lse, cu, scale)
    cuts = np.cumsum([0, H, K, K]) * D
    for name, a, b in zip(("dq", "dk", "dv"), cuts[:-1], cuts[1:], strict=True):
        assert_close(name, dqkv[:, a:b], want[:, a:b], BF16)


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("num_seqs,max_context", [(4, LONG), (64, 4352)])  # L1's 16 ... split; G3's 64, whole
def test_paged_decode_at_long_contexts(draw, heads, num_seqs, max_context):
    H, K = HEADS[heads]
    run_and_compare(*make_batch(draw, BF16, num_seqs, H, K, D, max_context, False), BF16)


@pytest.mark.parametrize("heads", list(HEADS))
def test_paged_prefill_against_a_cached_prefix(draw, heads):
    H, K = HEADS[heads]
    run_and_compare(*make_batch(draw, BF16, 5, H, K, D, 2048, True), BF16)


@pytest.mark.parametrize("heads", list(HEADS))
def test_invariant_decode_at_16k_equals_the_training_rows(draw, heads):
    """Batch-invariant decode attention at positions up to 16,639 (and mid-way): bitwise the training rows."""
    import cupy

    from barerl.ops import cuda

    H, K = HEADS[heads]
    lens = [LONG, 700]
    q, k, v, cu, k_cache, v_cache, tables = packed_and_paged(draw, BF16, lens, H, K, D, BLOCK_SIZE)
    o_train, _ = cuda.attention(q, k, v, cu, D**-0.5)
    starts = cu.get()[:-1]
    for positions in ([n - 1 for n in lens], [LONG // 2 - 1, 63]):
        rows = cupy.asarray([int(s) + p for s, p in zip(starts, positions)])
        contexts = cupy.asarray(np.asarray(positions, np.int32) + 1)
        decode_cu = cupy.arange(len(lens) + 1, dtype=np.int32)
        out = cuda.paged_attention(q[rows], k_cache, v_cache, tables, contexts, decode_cu, D**-0.5,
                                   batch_invariant=True)
        assert same_bits(out, o_train[rows]) == 0.0, positions


@pytest.mark.parametrize("hidden", [2560, 4096])
def test_lm_head_at_model_widths(draw, hidden):
    from barerl.ops import cuda

    V, T = 151936, 300
    h, w = draw.normal((T, hidden), BF16), draw.normal((V, hidden), BF16, 2 * hidden**-0.5)
    targets = draw.integers((T,), V)
    out = cuda.lm_head_logprobs(h, w, targets)
    want = ref.lm_head_logprobs(f32(h), f32(w), targets)
    for name, o, r in zip(("logprobs", "lse", "entropy"), out, want, strict=True):
        assert_close(name, o, r, BF16, 1e-3)
    dlogprobs, dw = draw.normal((T,), FP32), draw.normal((V, hidden), FP32, 1e-3)
    dw_ref = dw.copy()
    dh = cuda.lm_head_backward(dlogprobs, h, w, targets, out[1], dw)
    assert_close("dh", dh, ref.lm_head_backward(dlogprobs, f32(h), f32(w), targets, want[1], dw_ref), BF16)
    assert_close("dw", dw, dw_ref, BF16)
