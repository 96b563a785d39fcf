"""`Model.forward_paged` with `fresh_from`: sequences with no cached tokens attend among their own new tokens
(the training attention op) and give the logits the paged path gives, in pure and in mixed batches."""

import numpy as np
import pytest
from test_qk_norm_rope_store import CallCounter

from barerl.config import ModelConfig
from barerl.model.model import Model
from barerl.ops import ref

BLOCK = 4


def tiny_model():
    cfg = ModelConfig.from_dict({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rope_theta": 10000.0, "tie_word_embeddings": True, "max_position_embeddings": 64,
    })
    return Model.random(cfg, seed=3)


def step(model, kv_cache, seqs, fresh_from):
    """One forward_paged over seqs = [(token ids, cached count, block table)]: the uncached tokens are new."""
    ids, positions, slots, cu, lens, tables = [], [], [], [0], [], []
    for tokens, cached, table in seqs:
        ids += tokens[cached:]
        positions += range(cached, len(tokens))
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(cached, len(tokens))]
        cu.append(cu[-1] + len(tokens) - cached)
        lens.append(len(tokens))
        tables.append(table + [0] * (4 - len(table)))
    ids, positions, cu, lens, tables, slots = (np.array(x, np.int32) for x in (ids, positions, cu, lens, tables,
                                                                              slots))
    return model.forward_paged(ids, positions, cu, lens, tables, slots, kv_cache, fresh_from=fresh_from)


@pytest.mark.parametrize("mixed", [False, True], ids=["pure-prefill", "cached-then-fresh"])
def test_fresh_sequences_attend_among_their_own_tokens(mixed):
    model = tiny_model()
    rng = np.random.default_rng(0)
    a, b, c = (rng.integers(0, 64, n).tolist() for n in (6, 3, 7))
    caches, logits, calls, plain = [], [], [], model.ops
    for fresh in (False, True):
        kv_cache = model.allocate_kv_cache(12, BLOCK)
        if mixed:  # a's first 5 tokens are cached by an earlier step
            step(model, kv_cache, [(a[:5], 0, [0, 1])], None)
        seqs = ([(a, 5, [0, 1])] if mixed else []) + [(b, 0, [2]), (c, 0, [3, 4])]
        model.ops = CallCounter(ref, calls)
        logits.append(step(model, kv_cache, seqs, (1 if mixed else 0) if fresh else None))
        model.ops = plain
        caches.append(kv_cache)
    np.testing.assert_allclose(logits[1], logits[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(caches[1], caches[0], rtol=1e-6, atol=1e-6)
    layers = model.cfg.num_hidden_layers
    assert calls.count("attention") == layers  # the fresh sequences, once per layer
    assert calls.count("paged_attention") == layers * (1 + mixed)  # everything unfresh, plus a's token if mixed
