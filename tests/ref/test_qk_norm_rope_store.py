"""The engine's fused rotate-and-store op on the reference backend: `qk_norm_rope_store` is `qk_norm_rope`
then `store_kv`, and `Model.forward_paged` fills the KV cache through it with the packed path's k and v."""

import ml_dtypes
import numpy as np
import pytest

from barerl.config import ModelConfig
from barerl.model.batch import PackedBatch
from barerl.model.model import Model
from barerl.ops import ref

BF16 = np.dtype(ml_dtypes.bfloat16)
FP32 = np.dtype(np.float32)


def bits(x):
    return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=str)
@pytest.mark.parametrize("cache_dtype", [FP32, BF16], ids=str)
@pytest.mark.parametrize("shape", [(1, 4, 2, 16), (7, 2, 2, 64), (13, 6, 2, 32)], ids=str)  # T, H, K, D
@pytest.mark.parametrize("norm", [True, False])
def test_equals_qk_norm_rope_then_store_kv(dtype, cache_dtype, shape, norm):
    T, H, K, D = shape
    rng = np.random.default_rng(T * D)
    qkv = rng.standard_normal((T, (H + 2 * K) * D)).astype(dtype)
    positions = rng.integers(0, 50, T).astype(np.int32)
    angles = rng.uniform(0, 6.3, (50, D // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    q_norm, k_norm = (rng.standard_normal(D).astype(dtype) for _ in range(2)) if norm else (None, None)
    num_blocks, block_size = 4, 4
    slots = rng.permutation(num_blocks * block_size)[:T].astype(np.int32)
    slots[1::3] = -1  # padding rows write nothing
    cache_shape = (num_blocks, block_size, K, D)
    k_cache, v_cache = (rng.standard_normal(cache_shape).astype(cache_dtype) for _ in range(2))
    k_want, v_want = k_cache.copy(), v_cache.copy()
    rope_args = (qkv, positions, cos, sin, H, K, q_norm, k_norm, 1e-6)

    got = ref.qk_norm_rope_store(*rope_args, k_cache, v_cache, slots)
    want = ref.qk_norm_rope(*rope_args)
    _, k, v = np.split(want[0].reshape(T, H + 2 * K, D), [H, H + K], axis=1)
    ref.store_kv(k, v, k_want, v_want, slots)
    for name, g, w in zip(("out", "q_rstd", "k_rstd", "k_cache", "v_cache"), (*got, k_cache, v_cache),
                          (*want, k_want, v_want)):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert np.array_equal(bits(g), bits(w)), name


def test_forward_paged_fills_the_cache_through_the_fused_op():
    cfg = ModelConfig.from_dict({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rope_theta": 10000.0, "tie_word_embeddings": True, "max_position_embeddings": 64,
    })
    model = Model.random(cfg, seed=1)
    calls = []
    model.ops = CallCounter(ref, calls)
    lengths, block_size = [5, 3], 4
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, sum(lengths)).astype(np.int32)
    positions = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
    cu = np.array([0, 5, 8], np.int32)
    tables = np.array([[3, 0], [1, 2]], np.int32)  # sequence 0 in blocks 3, 0; sequence 1 in block 1
    slots = np.concatenate([tables[s, p // block_size] * block_size + p % block_size
                            for s, p in ((0, positions[:5]), (1, positions[5:]))]).astype(np.int32)
    kv_cache = model.allocate_kv_cache(4, block_size)
    model.forward_paged(ids, positions, cu, np.array(lengths, np.int32), tables, slots, kv_cache)
    assert calls.count("qk_norm_rope_store") == cfg.num_hidden_layers and "store_kv" not in calls

    batch = PackedBatch(ids, np.zeros_like(ids), np.zeros(ids.shape, np.float32), positions, cu, len(lengths))
    _, state = model.hidden_states(batch, keep=True, checkpoint=False)
    H, K, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    for i, acts in enumerate(state.saved):  # layers past the first saw another attention op: rounding apart
        k, v = np.split(acts.qkv_rot.reshape(-1, H + 2 * K, D)[:, H:], 2, axis=1)
        np.testing.assert_allclose(kv_cache[0, i].reshape(-1, K, D)[slots], k, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(kv_cache[1, i].reshape(-1, K, D)[slots], v, rtol=1e-5, atol=1e-6)


class CallCounter:
    """A backend whose op calls are appended, by name, to `calls`."""

    def __init__(self, backend, calls: list):
        self.backend, self.calls = backend, calls

    def __getattr__(self, name):
        op = getattr(self.backend, name)
        if not callable(op):
            return op
        return lambda *args, **kwargs: self.calls.append(name) or op(*args, **kwargs)
