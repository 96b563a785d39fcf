"""The reference attention walks each sequence's queries in chunks (QUERY_CHUNK rows), so that a long
sequence never needs its whole (H, L, L) scores: chunked and whole give the same outputs and gradients."""

import importlib

import numpy as np

nn = importlib.import_module("barerl.ops.ref.attention")  # the module (its package exports the op)


def test_query_chunks_change_nothing(monkeypatch):
    rng = np.random.default_rng(0)
    lengths, H, K, D = [37, 5, 64, 1], 4, 2, 8
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    T = int(cu[-1])
    q, do = (rng.standard_normal((T, H, D)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((T, K, D)).astype(np.float32) for _ in range(2))
    results = {}
    for chunk in (1 << 20, 7):  # whole sequences; chunks of 7 rows, a short last one in each sequence
        monkeypatch.setattr(nn, "QUERY_CHUNK", chunk)
        o, lse = nn.attention(q, k, v, cu, 0.3)
        results[chunk] = (o, lse, nn.attention_backward(do, q, k, v, o, lse, cu, 0.3))
    for whole, chunked in zip(results[1 << 20], results[7], strict=True):
        np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-6)
