"""The reference model against transformers (torch CPU, fp32): logits, log-probs, loss and the gradient of
the loss with respect to every parameter, on tiny random models of each family."""

import numpy as np
import pytest
import torch

from barerl.config import ModelConfig
from barerl.model.model import Model, PackedBatch
from barerl.model.recompute import RECOMPUTABLE
from barerl.model.weights import ParameterBuffer

transformers = pytest.importorskip("transformers")

BASE = {
    "vocab_size": 96, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
}
FAMILIES = {
    "qwen3": (transformers.Qwen3Config, {"tie_word_embeddings": True}),
    "qwen2": (transformers.Qwen2Config, {"tie_word_embeddings": False, "head_dim": None, "num_attention_heads": 4}),
    "llama3": (
        transformers.LlamaConfig,
        {
            "tie_word_embeddings": True, "num_key_value_heads": 1,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 32},
        },
    ),
    "untied": (transformers.LlamaConfig, {"tie_word_embeddings": False, "num_key_value_heads": 4}),
}


def build_pair(family, seed=0):
    """A random transformers model and our Model holding the same weights (fp32)."""
    config_cls, extra = FAMILIES[family]
    kwargs = {**BASE, **extra}
    if kwargs.get("head_dim") is None:
        kwargs.pop("head_dim")
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(config_cls(**kwargs), attn_implementation="eager")
    hf = hf.float().eval()
    with torch.no_grad():  # non-trivial norms and biases, so their gradients mean something
        for name, p in hf.named_parameters():
            if name.endswith(("norm.weight", ".bias")):
                p.add_(torch.randn_like(p) * 0.1)
    cfg = ModelConfig.from_dict(hf.config.to_dict(), source=family)
    params = ParameterBuffer.zeros(cfg, np, np.float32)
    state = hf.state_dict()
    for name, view in params:
        view[...] = state[name].numpy()
    return hf, Model(cfg, params)


def sequences(rng, lengths, vocab):
    return [rng.integers(0, vocab, size=n).tolist() for n in lengths]


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def hf_loss_and_grads(hf, seqs):
    """Mean next-token cross-entropy over all predicted tokens of all sequences, with torch autograd."""
    hf.zero_grad()
    total, count, logps = 0.0, 0, []
    for seq in seqs:
        ids = torch.tensor([seq])
        logits = hf(ids).logits[0, :-1]
        lp = torch.log_softmax(logits.double(), -1).gather(1, ids[0, 1:, None])[:, 0]
        logps.append(lp.detach().numpy())
        total = total + (-lp).sum()
        count += len(seq) - 1
    (total / count).backward()
    grads = {n: p.grad.numpy().copy() for n, p in hf.named_parameters()}
    return float((total / count).detach()), logps, grads


def mean_ce_loss(mask):
    n = mask.sum()

    def loss_fn(logp, entropy):
        return float(-(logp * mask).sum() / n), -mask / n, {}

    return loss_fn


def last_token_mask(seqs):
    mask = np.ones(sum(len(s) for s in seqs), np.float32)
    mask[np.cumsum([len(s) for s in seqs]) - 1] = 0.0
    return mask


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers(family):
    hf, model = build_pair(family)
    seq = sequences(np.random.default_rng(1), [37], model.cfg.vocab_size)[0]
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0].numpy()
    h, _ = model.hidden_states(PackedBatch.from_sequences([seq]))
    ours = model.backend.lm_head_logits(h, model.params.lm_head)
    assert rel_err(ours, ref) < 1e-4, rel_err(ours, ref)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("checkpoint", [False, True])
def test_loss_logprobs_and_every_gradient_match_transformers(family, checkpoint):
    hf, model = build_pair(family)
    seqs = sequences(np.random.default_rng(2), [13, 29, 5], model.cfg.vocab_size)
    ref_loss, ref_logps, ref_grads = hf_loss_and_grads(hf, seqs)

    batch = PackedBatch.from_sequences(seqs)
    mask = last_token_mask(seqs)
    grads = model.zeros_like_params()
    loss, _ = model.forward_backward(batch, mean_ce_loss(mask), grads, checkpoint=checkpoint)

    assert abs(loss - ref_loss) / ref_loss < 1e-5
    logp, _ = model.logprobs(batch)
    assert rel_err(logp[mask > 0], np.concatenate(ref_logps)) < 1e-4
    worst = {}
    for name, g in grads:
        worst[name] = rel_err(g, ref_grads[name])
    if model.cfg.tie_word_embeddings:
        assert "lm_head.weight" not in worst
    assert set(worst) | ({"lm_head.weight"} if model.cfg.tie_word_embeddings else set()) >= set(ref_grads)
    bad = {n: e for n, e in worst.items() if e > 1e-3}
    assert not bad, bad


def test_packed_batch_equals_each_sequence_alone():
    _, model = build_pair("qwen3")
    seqs = sequences(np.random.default_rng(3), [7, 19, 1, 11], model.cfg.vocab_size)
    packed, _ = model.logprobs(PackedBatch.from_sequences(seqs))
    alone = np.concatenate([model.logprobs(PackedBatch.from_sequences([s]))[0] for s in seqs])
    np.testing.assert_allclose(packed, alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keep", [(), ("attention",), ("linear", "swiglu"), RECOMPUTABLE], ids=str)
def test_checkpointed_and_plain_backward_agree(keep):
    """Whatever checkpointing keeps through the forward pass, the gradients are the plain backward's, and the
    recomputation calls only the ops it did not keep, never the layer's last product (down: its output is the
    next layer's input)."""
    from collections import Counter

    _, model = build_pair("qwen2")
    seqs = sequences(np.random.default_rng(4), [9, 17], model.cfg.vocab_size)
    batch, mask = PackedBatch.from_sequences(seqs), last_token_mask(seqs)
    g_plain, g_ckpt = model.zeros_like_params(), model.zeros_like_params()
    model.forward_backward(batch, mean_ce_loss(mask), g_plain, checkpoint=False)
    calls, backend = Counter(), model.ops

    class CountingOps:
        def __getattr__(self, name):
            calls[name] += 1
            return getattr(backend, name)

    model.ops = CountingOps()
    try:
        model.forward_backward(batch, mean_ce_loss(mask), g_ckpt, checkpoint=True, keep_ops=keep)
    finally:
        model.ops = backend
    np.testing.assert_array_equal(g_plain.flat, g_ckpt.flat)
    layers = model.cfg.num_hidden_layers
    recomputed = {"attention": 1, "linear": 3, "swiglu": 1}  # a layer's forward calls of these ops, down aside
    for op, n in recomputed.items():
        assert calls[op] == (n + (op == "linear")) * layers + (0 if op in keep else n * layers), op


def test_unknown_ops_to_keep_are_rejected():
    _, model = build_pair("qwen2")
    seqs = sequences(np.random.default_rng(4), [9], model.cfg.vocab_size)
    with pytest.raises(ValueError, match="mlp"):
        model.forward_backward(PackedBatch.from_sequences(seqs), mean_ce_loss(last_token_mask(seqs)),
                               model.zeros_like_params(), keep_ops=("mlp",))
