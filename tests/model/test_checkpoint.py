"""Checkpoints against transformers: what `save_pretrained` writes we load bit for bit (fp32, bf16, fp16,
single and sharded), what we save `from_pretrained` loads bit for bit, ours round-trips, and bad input gives
an error naming the file and the tensor or field."""

import dataclasses
import json
import os
import re
import struct
import sys
import types

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from barerl.config import ConfigError, ModelConfig
from barerl.formats import CheckpointError
from barerl.formats.safetensors import read_safetensors, write_safetensors
from barerl.info import describe
from barerl.model.checkpoint import load_checkpoint, save_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def torch_state(model) -> dict[str, np.ndarray]:
    """The model's state dict as fp32 NumPy (exact for bf16/fp16: widening loses nothing)."""
    return {name: t.detach().float().numpy() for name, t in model.state_dict().items()}


def assert_params_equal(params, state):
    assert set(params.views) <= set(state)
    for name, view in params:
        np.testing.assert_array_equal(view.astype(np.float32), state[name], err_msg=name)
    np.testing.assert_array_equal(params.lm_head.astype(np.float32), state["lm_head.weight"])


def hf_load(folder, dtype=torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager")


# ---------------------------------------------------------------------------------------------------------
# Loading what transformers saved


@pytest.mark.parametrize("dtype, shard", [("float32", None), ("float32", "50KB"), ("bfloat16", None),
                                          ("float16", "50KB")])
def test_load_equals_transformers(tiny_hf_model, tiny_hf_family, tmp_path, dtype, shard):
    folder, model = tiny_hf_model(tiny_hf_family, tmp_path, dtype=dtype, max_shard_size=shard)
    assert os.path.exists(folder / "model.safetensors.index.json") == (shard is not None)
    cfg, params = load_checkpoint(folder, dtype=dtype)
    assert params.flat.dtype == np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    assert_params_equal(params, torch_state(model))
    hf = model.config
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert (cfg.tie_word_embeddings, cfg.head_dim, cfg.num_key_value_heads, cfg.attention_bias) == (
        hf.tie_word_embeddings, head_dim, hf.num_key_value_heads, tiny_hf_family == "qwen2")
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"]
    assert (cfg.rope_scaling or {}).get("rope_type") == ("llama3" if tiny_hf_family == "llama3" else None)
    assert cfg.torch_dtype == dtype


@pytest.mark.parametrize("disk, target", [("float32", "bfloat16"), ("float32", "float16"),
                                          ("bfloat16", "float32"), ("float16", "bfloat16")])
def test_load_casts_like_torch(tiny_hf_model, tmp_path, disk, target):
    folder, model = tiny_hf_model("qwen2", tmp_path, dtype=disk)
    _, params = load_checkpoint(folder, dtype=target)
    assert_params_equal(params, torch_state(model.to(getattr(torch, target))))


def test_load_accepts_tied_lm_head_when_equal_and_harmless_extras(tiny_hf_model, tmp_path):
    folder, model = tiny_hf_model("qwen3", tmp_path)
    tensors = safetensors.numpy.load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in tensors  # tied: transformers leaves it out
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    safetensors.numpy.save_file(tensors, folder / "model.safetensors")
    _, params = load_checkpoint(folder)
    assert_params_equal(params, torch_state(model))


def test_load_gguf_goes_through_read_gguf(tiny_hf_model, tmp_path, monkeypatch):
    """The GGUF path with a stand-in reader of the agreed API (`.config`, `.tensors` float32 by HF name)."""
    _, model = tiny_hf_model("llama3", tmp_path)
    state = torch_state(model)
    fake = types.SimpleNamespace(config=model.config.to_dict(),
                                 tensors={k: v for k, v in state.items() if k != "lm_head.weight"})
    module = types.ModuleType("barerl.formats.gguf")
    module.read_gguf = lambda path: fake
    monkeypatch.setitem(sys.modules, "barerl.formats.gguf", module)
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF")
    cfg, params = load_checkpoint(path, dtype="bfloat16")
    assert cfg.rope_scaling["rope_type"] == "llama3"
    assert_params_equal(params, torch_state(model.to(torch.bfloat16)))
    del fake.tensors["model.norm.weight"]
    with pytest.raises(CheckpointError, match=r"tiny\.gguf.*'model\.norm\.weight'.*missing"):
        load_checkpoint(path)


@pytest.mark.slow
def test_load_real_gguf(smollm2_gguf_path, smollm2_hf_model):
    """SmolLM2-135M (Q4_1/Q8_0/F32) through load_checkpoint equals transformers' own GGUF load."""
    pytest.importorskip("barerl.formats.gguf")
    cfg, params = load_checkpoint(smollm2_gguf_path)
    assert (cfg.architecture, cfg.num_hidden_layers, cfg.hidden_size) == ("LlamaForCausalLM", 30, 576)
    state = torch_state(smollm2_hf_model)
    for name, view in params:
        np.testing.assert_allclose(view, state[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.gpu
def test_load_onto_cupy(tiny_hf_model, tmp_path):
    cupy = pytest.importorskip("cupy")
    if cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA device")
    folder, _ = tiny_hf_model("qwen3", tmp_path, dtype="bfloat16")
    cfg, params = load_checkpoint(folder, dtype="bfloat16", xp=cupy)
    assert isinstance(params.flat, cupy.ndarray)
    _, host = load_checkpoint(folder, dtype="bfloat16")
    np.testing.assert_array_equal(params.flat.get(), host.flat)
    save_checkpoint(tmp_path / "ours", cfg, params)
    np.testing.assert_array_equal(load_checkpoint(tmp_path / "ours", dtype="bfloat16")[1].flat, host.flat)


# ---------------------------------------------------------------------------------------------------------
# Saving for transformers, and round trips


@pytest.mark.parametrize("dtype, max_shard_bytes", [("float32", 5 * 10**9), ("bfloat16", 50_000)])
def test_transformers_loads_what_we_save(tiny_hf_model, tiny_hf_family, tmp_path, dtype, max_shard_bytes):
    folder, model = tiny_hf_model(tiny_hf_family, tmp_path)
    cfg, params = load_checkpoint(folder)
    out = tmp_path / "ours"
    save_checkpoint(out, cfg, params, dtype=dtype, max_shard_bytes=max_shard_bytes)
    sharded = max_shard_bytes < params.flat.nbytes
    assert os.path.exists(out / "model.safetensors.index.json") == sharded
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    assert (len(shards) > 1) == sharded
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == dtype
    loaded = hf_load(out, getattr(torch, dtype))
    _, ours = load_checkpoint(out, dtype=dtype)
    assert_params_equal(ours, torch_state(loaded))
    if dtype == "float32":  # same weights, same config: same logits
        ids = torch.tensor([[1, 5, 9, 33, 2, 70, 11]])
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("dtype, max_shard_bytes", [("float32", 50_000), ("bfloat16", 5 * 10**9),
                                                    ("float16", 30_000)])
def test_round_trip(tiny_hf_model, tmp_path, dtype, max_shard_bytes):
    folder, _ = tiny_hf_model("untied", tmp_path)
    cfg, params = load_checkpoint(folder, dtype=dtype)
    save_checkpoint(tmp_path / "ours", cfg, params, max_shard_bytes=max_shard_bytes)
    cfg2, params2 = load_checkpoint(tmp_path / "ours", dtype=dtype)
    assert cfg2 == dataclasses.replace(cfg, torch_dtype=dtype)
    np.testing.assert_array_equal(params2.flat, params.flat)


def tiny_hf_tokenizer(chat_template=None):
    """A 4-token transformers tokenizer (no downloads)."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, "hello": 3}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", chat_template=chat_template)


def test_saves_generation_config_and_tokenizer(tiny_hf_model, tmp_path):
    folder, _ = tiny_hf_model("llama3", tmp_path, bos_token_id=0, eos_token_id=[1, 2])
    cfg, params = load_checkpoint(folder)
    out = tmp_path / "ours"
    save_checkpoint(out, cfg, params, tokenizer=tiny_hf_tokenizer(),
                    generation_config={"temperature": 0.6, "do_sample": True})
    gen = transformers.GenerationConfig.from_pretrained(out)
    assert (gen.bos_token_id, gen.eos_token_id, gen.temperature, gen.do_sample) == (0, [1, 2], 0.6, True)
    assert transformers.AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("hello") == 3


def test_save_replaces_atomically(tiny_hf_model, tmp_path):
    folder, _ = tiny_hf_model("qwen3", tmp_path)
    cfg, params = load_checkpoint(folder)
    out = tmp_path / "ours"
    save_checkpoint(out, cfg, params)
    params.flat[:] = 0.5
    save_checkpoint(out, cfg, params)
    assert (load_checkpoint(out)[1].flat == 0.5).all()

    class Failing:
        def save_pretrained(self, path):
            raise OSError("disk full")

    params.flat[:] = 0.25
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(out, cfg, params, tokenizer=Failing())
    assert (load_checkpoint(out)[1].flat == 0.5).all()  # the old checkpoint, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name, "ours"]  # no tmp / old leftovers

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "diary.txt").write_text("precious")
    with pytest.raises(CheckpointError, match=r"notes.*no config\.json.*refusing"):
        save_checkpoint(tmp_path / "notes", cfg, params)
    assert (tmp_path / "notes" / "diary.txt").read_text() == "precious"
    (out / "checkpoint-100").mkdir()  # a run folder with checkpoints inside is not replaced either
    with pytest.raises(CheckpointError, match=r"ours.*subfolders.*refusing"):
        save_checkpoint(out, cfg, params)


# ---------------------------------------------------------------------------------------------------------
# Bad input


@pytest.fixture
def qwen3_folder(tiny_hf_model, tmp_path):
    return tiny_hf_model("qwen3", tmp_path)[0]


def edit_weights(folder, edit):
    """Rewrite model.safetensors after `edit(tensors)` (with the safetensors package, not our writer)."""
    tensors = safetensors.numpy.load_file(folder / "model.safetensors")
    edit(tensors)
    safetensors.numpy.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def edit_config(folder, edit):
    d = json.loads((folder / "config.json").read_text())
    edit(d)
    (folder / "config.json").write_text(json.dumps(d))


def test_missing_config(qwen3_folder):
    os.remove(qwen3_folder / "config.json")
    with pytest.raises(ConfigError, match=r"config\.json.*no such file"):
        load_checkpoint(qwen3_folder)


def test_unknown_architecture(qwen3_folder):
    edit_config(qwen3_folder, lambda d: d.update(architectures=["MambaForCausalLM"]))
    with pytest.raises(ConfigError, match=r"config\.json.*'architectures'.*MambaForCausalLM"):
        load_checkpoint(qwen3_folder)


def test_missing_config_field(qwen3_folder):
    edit_config(qwen3_folder, lambda d: d.pop("hidden_size"))
    with pytest.raises(ConfigError, match=r"config\.json.*'hidden_size'.*missing"):
        load_checkpoint(qwen3_folder)


def test_wrong_tensor_shape(qwen3_folder):
    name = "model.layers.1.self_attn.k_proj.weight"
    edit_weights(qwen3_folder, lambda t: t.update({name: t[name][:32]}))
    with pytest.raises(CheckpointError, match=rf"model\.safetensors.*'{name}'.*\(32, 64\).*\(64, 64\)"):
        load_checkpoint(qwen3_folder)


def test_config_contradicting_weights(qwen3_folder):
    edit_config(qwen3_folder, lambda d: d.update(intermediate_size=100))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.\w+\.weight' "
                                              r"has shape \((112, 64|64, 112)\), but the config implies \((100, 64|64, 100)\)"):
        load_checkpoint(qwen3_folder)


def test_missing_tensor(qwen3_folder):
    edit_weights(qwen3_folder, lambda t: t.pop("model.layers.0.self_attn.q_norm.weight"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*'model\.layers\.0\.self_attn\.q_norm\.weight'"
                                              r".*\(32,\).*missing"):
        load_checkpoint(qwen3_folder)


def test_unexpected_tensor(qwen3_folder):
    edit_weights(qwen3_folder, lambda t: t.update({"model.layers.2.mlp.up_proj.weight": np.zeros((4, 4), np.float32)}))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*unexpected tensor 'model\.layers\.2\.mlp"):
        load_checkpoint(qwen3_folder)


def test_tied_lm_head_that_differs(qwen3_folder):
    edit_weights(qwen3_folder, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1}))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*'lm_head\.weight'.*tie_word_embeddings"):
        load_checkpoint(qwen3_folder)


def test_truncated_safetensors(qwen3_folder):
    path = qwen3_folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor '.*'.*truncated"):
        load_checkpoint(qwen3_folder)
    path.write_bytes(b"\x01\x02\x03")
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*too short"):
        load_checkpoint(qwen3_folder)


@pytest.mark.parametrize("header, why", [
    (b"this is not json at all", "not valid JSON"),
    (b"[1, 2, 3]", "not a JSON object"),
    (b'{"w": {"dtype": "I4", "shape": [2], "data_offsets": [0, 1]}}', "'w'.*dtype 'I4'"),
    (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', "'w'.*do not match shape"),
    (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}', "'w'.*not an increasing"),
    (b'{"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}', "'w'.*shape"),
])
def test_corrupt_safetensors_header(qwen3_folder, header, why):
    (qwen3_folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    with pytest.raises(CheckpointError, match=rf"model\.safetensors.*{why}"):
        load_checkpoint(qwen3_folder)


def test_header_length_past_end_of_file(qwen3_folder):
    (qwen3_folder / "model.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*header length 1000000000000"):
        load_checkpoint(qwen3_folder)


def test_pickle_checkpoint_is_refused(qwen3_folder):
    os.rename(qwen3_folder / "model.safetensors", qwen3_folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*never unpickles.*safetensors"):
        load_checkpoint(qwen3_folder)


def test_sharded_index_naming_a_missing_shard(tiny_hf_model, tmp_path):
    folder, _ = tiny_hf_model("qwen2", tmp_path, max_shard_size="50KB")
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    os.remove(shard)
    with pytest.raises(CheckpointError, match=rf"index\.json.*'{shard.name}'.*does not exist"):
        load_checkpoint(folder)


def test_corrupt_index(tiny_hf_model, tmp_path):
    folder, _ = tiny_hf_model("qwen2", tmp_path, max_shard_size="50KB")
    index = folder / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    moved = weight_map.pop("model.norm.weight")
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=rf"{moved}: tensor 'model\.norm\.weight' is not listed"):
        load_checkpoint(folder)
    index.write_text("{not json")
    with pytest.raises(CheckpointError, match=r"index\.json: not a valid index"):
        load_checkpoint(folder)


def test_not_a_checkpoint_path(tmp_path):
    with pytest.raises(CheckpointError, match=r"nowhere.*no such file"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "weights.txt").write_text("hi")
    with pytest.raises(CheckpointError, match=r"weights\.txt.*expected a model folder"):
        load_checkpoint(tmp_path / "weights.txt")


def test_write_safetensors_is_standard(tmp_path):
    """Our writer's files read back with the safetensors package itself; header padded to 8 bytes."""
    rng = np.random.default_rng(0)
    arrays = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7),
              "c": rng.standard_normal((2, 1, 3)).astype(np.float16), "empty": np.zeros((0, 4), np.float32)}
    path = str(tmp_path / "x.safetensors")
    write_safetensors(path, arrays.items(), metadata={"step": "3"})
    back = safetensors.numpy.load_file(path)
    assert set(back) == set(arrays)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype
        np.testing.assert_array_equal(back[name], a)
    with safetensors.safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "step": "3"}
    header_len = struct.unpack("<Q", (tmp_path / "x.safetensors").read_bytes()[:8])[0]
    assert header_len % 8 == 0
    with pytest.raises(ValueError, match=r"x\.safetensors: tensor 'i': cannot store int64"):
        write_safetensors(path, [("i", np.arange(3))])


def test_read_safetensors_is_memory_mapped(qwen3_folder):
    tensors = read_safetensors(str(qwen3_folder / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"]
    assert isinstance(embed.base, np.memmap) or isinstance(embed, np.memmap) or not embed.flags.owndata
    assert not embed.flags.writeable


# ---------------------------------------------------------------------------------------------------------
# barerl info


def test_describe(tiny_hf_model, tmp_path):
    folder, model = tiny_hf_model("llama3", tmp_path, bos_token_id=0, eos_token_id=1)
    cfg = ModelConfig.from_file(folder / "config.json")
    tok = types.SimpleNamespace(vocab_size=96, bos_token="<s>", bos_token_id=0, eos_token="</s>",
                                eos_token_id=1, chat_template="{{ messages }}")
    text = re.sub(" +", " ", describe(cfg, tok, {"BF16": 20, "F32": 1}))  # column widths vary
    n = sum(p.numel() for p in model.parameters())
    for fact in ["LlamaForCausalLM", "layers 2", "hidden 64", "4 query, 1 key/value",
                 "head_dim 16", "intermediate 112", "tied", "theta 500000", "llama3 (factor 8",
                 f"{n / 1e6:.2f}M ({n:,})", "BF16 (20 tensors), F32 (1 tensor)", "'<s>' (id 0)", "'</s>' (id 1)",
                 "chat template yes"]:
        assert fact in text, (fact, text)
    assert re.search("tokenizer +none found", describe(cfg))
    assert re.search("dtype on disk +float32", describe(cfg))


def test_info_command(tiny_hf_model, tmp_path, capsys):
    from barerl.cli import main

    folder, _ = tiny_hf_model("qwen3", tmp_path, dtype="bfloat16")
    cfg, params = load_checkpoint(folder, dtype="bfloat16")
    save_checkpoint(tmp_path / "ours", cfg, params, tokenizer=tiny_hf_tokenizer("{{ messages[0]['content'] }}"))
    assert main(["info", "--model", str(tmp_path / "ours")]) == 0
    out = re.sub(" +", " ", capsys.readouterr().out)
    for fact in ["Qwen3ForCausalLM", "q/k RMSNorm", "theta 1e+06", "BF16 (", "'<s>' (id 0)", "chat template yes"]:
        assert fact in out, (fact, out)
    assert main(["info", "--model", str(tmp_path / "missing")]) == 1
    assert "missing: no such file or folder" in capsys.readouterr().err
