"""Helpers shared by the tests in tests/train (imported as `from train_helpers import ...`)."""

import numpy as np

from barerl.config import ModelConfig
from barerl.model.weights import ParameterBuffer


def tiny_cfg(**kw) -> ModelConfig:
    """A Qwen3-shaped config (q/k norms, untied head) small enough for exact optimizer comparisons."""
    d = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 37, "hidden_size": 16, "intermediate_size": 24,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
         "tie_word_embeddings": False}
    d.update(kw)
    return ModelConfig.from_dict(d)


def random_problem(cfg, steps, seed=0, grad_scale=1.0):
    """Random fp32 initial weights and `steps` random gradients, flat in the model's layout."""
    rng = np.random.default_rng(seed)
    n = ParameterBuffer.zeros(cfg, np, np.float32).flat.shape[0]
    init = rng.standard_normal(n).astype(np.float32)
    grads = [(rng.standard_normal(n) * grad_scale).astype(np.float32) for _ in range(steps)]
    return init, grads
