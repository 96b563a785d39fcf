"""Engine test helpers: a mock model that reads everything back from the paged cache, a tiny tokenizer, and
a naive one-sequence-at-a-time generator as the oracle for the engine's batching, paging and forking.
Imported by the tests (`from engine_helpers import ...`), like tests/ops/kernel_harness.py."""

from types import SimpleNamespace

import numpy as np

from barerl.engine.sampling_params import derive_seed
from barerl.ops import ref


class PagedMockModel:
    """Stands in for `Model`. forward_paged writes each new token (and its position) into the paged cache,
    then rebuilds every sequence's whole history from the cache through its block table: a wrong slot,
    block table, block copy or freed-too-early block changes the history and so the logits. The logits are
    a fixed pseudo-random function of the history (or `script(history)` -> token, made near-certain)."""

    def __init__(self, vocab_size=32, max_position_embeddings=256, eos_token_id=None, script=None, scale=2.0):
        self.cfg = SimpleNamespace(vocab_size=vocab_size, max_position_embeddings=max_position_embeddings,
                                   eos_token_ids=[] if eos_token_id is None else [eos_token_id])
        self.ops, self.xp, self.dtype, self.device = ref, np, np.dtype(np.float32), "cpu"
        self.batch_invariant = False
        self.script, self.scale = script, scale
        self.num_forward_tokens = 0

    def kv_cache_bytes_per_token(self):
        return 8

    def allocate_kv_cache(self, num_blocks, block_size):
        return np.full((2, 1, num_blocks, block_size, 1, 1), -1.0, np.float32)

    def logits_for(self, history):
        V = self.cfg.vocab_size
        if self.script is not None:
            logits = np.full(V, -30.0, np.float32)
            logits[self.script(list(history))] = 30.0
            return logits
        rng = np.random.default_rng(abs(hash(tuple(history))) % 2**32)
        return (rng.normal(size=V) * self.scale).astype(np.float32)

    def forward_paged(self, input_ids, positions, cu_seqlens_q, context_lens, block_tables, slot_mapping, kv,
                      max_position=None, fresh_from=None):
        k, v = kv[0, 0].reshape(-1), kv[1, 0].reshape(-1)
        k[slot_mapping], v[slot_mapping] = input_ids, positions
        self.num_forward_tokens += len(input_ids)
        block_size = kv.shape[3]
        logits = []
        for s, ctx in enumerate(context_lens):
            pos = np.arange(ctx)
            slots = block_tables[s][pos // block_size] * block_size + pos % block_size
            assert (block_tables[s][: -(-ctx // block_size)] >= 0).all()
            np.testing.assert_array_equal(v[slots], pos, err_msg=f"sequence {s}: cache holds wrong positions")
            logits.append(self.logits_for(k[slots].astype(np.int64)))
        return np.stack(logits)


class CharTokenizer:
    """Token i is the string VOCAB[i]: single characters and a few longer pieces; token 0 is "<eos>"."""

    VOCAB = ("<eos>", *"abcdefghijklmnopqrstuvwxyz .,!?", "lo w", "orld")

    def __init__(self):
        self.eos_token_ids = [0]

    def encode(self, text, add_special_tokens=True):
        return [self.VOCAB.index(c) for c in text]

    def ids(self, *pieces):
        return [self.VOCAB.index(p) for p in pieces]

    def decode(self, ids, skip_special_tokens=False):
        return "".join("" if (i == 0 and skip_special_tokens) else self.VOCAB[i] for i in ids)


def scripted_model(tokenizer, pieces, prompt_len, **kwargs):
    """A mock model whose greedy continuation of a prompt_len-token prompt is `pieces`, then <eos> forever."""
    script_ids = tokenizer.ids(*pieces)

    def script(history):
        i = len(history) - prompt_len
        return script_ids[i] if i < len(script_ids) else 0

    return PagedMockModel(vocab_size=len(tokenizer.VOCAB), eos_token_id=0, script=script, **kwargs)


def naive_generate(model, prompt, params, seed):
    """One sample list per request, token by token with full recompute: the oracle (no eos, no stops)."""
    samples = []
    for i in range(params.n):
        history, tokens, logprobs = list(prompt), [], []
        for counter in range(params.max_tokens):
            logits = model.logits_for(history)[None]
            t, lp = ref.sample(
                logits, np.array([params.temperature], np.float32),
                np.array([max(params.top_k, 0)], np.int32),
                np.array([params.top_p], np.float32), np.array([params.min_p], np.float32),
                np.array([derive_seed(seed, i)], np.uint64), np.array([counter], np.int64),
            )
            history.append(int(t[0]))
            tokens.append(int(t[0]))
            logprobs.append(float(lp[0]))
        samples.append((tokens, logprobs))
    return samples
