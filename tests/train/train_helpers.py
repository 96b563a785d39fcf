"""Helpers shared by the tests in tests/train (imported as `from train_helpers import ...`)."""

import json
import os
import subprocess
import sys
import types

import numpy as np

from barerl.config import ModelConfig
from barerl.model.model import Model
from barerl.model.weights import ParameterBuffer
from barerl.train.config import GRPOConfig
from barerl.train.demo import make_tokenizer
from barerl.train.grpo import train_grpo


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


# ---------------------------------------------------------------------------------------------------------
# The SFT and GRPO loops on a tiny model and the addition task (tests of the loops, interrupts, output folders)


def tiny_model(seed=0) -> Model:
    cfg = ModelConfig.from_dict({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 15, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "tie_word_embeddings": True, "max_position_embeddings": 64, "eos_token_id": 2, "bos_token_id": 1,
    })
    return Model.random(cfg, seed=seed)


PROMPTS = [{"prompt": f"{a}+{b}="} for a in range(4) for b in range(4)]
SFT_ROWS = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(10) for b in range(10)]


def starts_with_seven(prompts, completions, **_):
    """Known optimum: always answer 7 first."""
    return [float(c.startswith("7")) for c in completions]


def grpo_config(tmp_path, **kw) -> GRPOConfig:
    base = {"output_dir": str(tmp_path), "max_steps": 4, "learning_rate": 3e-2, "num_generations": 8,
            "per_device_train_batch_size": 32, "max_completion_length": 3, "max_prompt_length": 8,
            "lr_scheduler_type": "constant", "save_steps": 0, "seed": 3, "log_completions_steps": 0}
    return GRPOConfig(**{**base, **kw})


def run_grpo(cfg, model=None, reward_funcs=(starts_with_seven,)):
    return train_grpo(cfg, model=model or tiny_model(), tokenizer=make_tokenizer(), rows=PROMPTS,
                      reward_funcs=list(reward_funcs), show_progress=False, engine_args={"num_kv_blocks": 64})


def sft_config(output_dir, **kw):
    from barerl.train.config import SFTConfig

    base = {"output_dir": str(output_dir), "max_steps": 4, "save_steps": 2, "learning_rate": 1e-2,
            "per_device_train_batch_size": 8, "packing": False, "seed": 5, "lr_scheduler_type": "constant"}
    return SFTConfig(**{**base, **kw})


def run_sft(cfg, model=None):
    from barerl.train.sft import train_sft

    return train_sft(cfg, model=model or tiny_model(), tokenizer=make_tokenizer(), rows=SFT_ROWS,
                     show_progress=False)


def read_jsonl(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def metrics(output_dir) -> list[dict]:
    """metrics.jsonl without the timings (which differ from run to run)."""
    rows = read_jsonl(os.path.join(output_dir, "metrics.jsonl"))
    for r in rows:
        for key in [k for k in r if k.startswith("time") or "per_second" in k]:
            del r[key]
    return rows


def smollm2_like_model(device: str, dtype: str, seed=0, max_position_embeddings=64) -> Model:
    """SmolLM2's shape in miniature (Llama, 3 query heads per kv head, tied head), the same random weights on
    either device; head_dim 64 so that the GPU runs its attention kernels."""
    from barerl.formats.safetensors import resolve_dtype

    cfg = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 15, "hidden_size": 96, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 64,
        "tie_word_embeddings": True, "max_position_embeddings": max_position_embeddings, "eos_token_id": 2,
        "bos_token_id": 1,
    })
    cpu = Model.random(cfg, seed=seed)
    if device == "cpu":
        return cpu
    import cupy

    return Model(cfg, ParameterBuffer(cfg, cupy.asarray(cpu.params.flat.astype(resolve_dtype(dtype)))), "cuda")


def write_model_folder(tmp_path):
    """The tiny model and the demo's tokenizer as a Hugging Face folder, and SFT_ROWS as a JSONL file."""
    from barerl.model.checkpoint import save_checkpoint
    from barerl.train.demo import make_tokenizer

    model = tiny_model()
    folder = tmp_path / "model"
    save_checkpoint(folder, model.cfg, model.params, tokenizer=make_tokenizer())
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in SFT_ROWS))
    return folder, data


def cli(*args, **kw):
    """`python -m barerl.cli ARGS` in a subprocess, output captured."""
    return subprocess.run([sys.executable, "-m", "barerl.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, check=False, **kw)


def stand_in_datasets(monkeypatch, splits=None, error=None) -> list:
    """The datasets library replaced by a Hub whose every dataset has `splits` (name -> rows), or that raises
    `error`; returns the (name, config, split) it was asked for."""
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        if error is not None:
            raise error
        return types.SimpleNamespace(to_list=lambda: list(splits[split]))

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls
