"""GGUF reader: dequantisation vs the `gguf` package, HF names/shapes/config vs transformers' GGUF loader,
the llama q/k row permutation, Llama 3 rope scaling, and clear errors for broken files.

Synthetic files come from conftest's `tiny_gguf` (gguf.GGUFWriter fed random Hugging Face-shaped weights converted
to llama.cpp's layout in the test), so a round trip checks names, shapes and the permute.
"""

import math

import numpy as np
import pytest

from barerl.config import ConfigError, ModelConfig, parameter_shapes
from barerl.formats.gguf import GGUFError, read_gguf
from barerl.formats.gguf_quants import GGML_TYPES, dequantize, type_name

gguf = pytest.importorskip("gguf")

# ----------------------------------------------------------------------------------------------------------
# Dequantisation


def _assert_equal(name, ours, ref):
    assert ours.shape == ref.shape, f"{name}: shape {ours.shape} != {ref.shape}"
    if not np.array_equal(ours, ref, equal_nan=True):
        err = np.abs(ours - ref)
        rel = err / np.maximum(np.abs(ref), 1e-30)
        pytest.fail(f"{name}: max abs err {err.max():.3g}, max rel err {rel.max():.3g}")


# byte offsets of the fp16 scale fields in one block, per type (so random blocks get finite scales)
_F16_FIELDS = {8: [0], 2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 12: [0, 2], 13: [0, 2], 14: [208]}


@pytest.mark.parametrize("ggml_type", sorted(GGML_TYPES), ids=type_name)
def test_dequantise_matches_gguf_package(ggml_type):
    block, type_size, _ = GGML_TYPES[ggml_type]
    rng = np.random.default_rng(ggml_type)
    rows, blocks_per_row = 5, 3  # odd shapes on purpose
    if block == 1:  # plain floats: random finite values
        values = rng.standard_normal((rows, 3 * 7)).astype(np.float32)
        raw = {0: values, 1: values.astype(np.float16)}.get(ggml_type)
        raw = gguf.quantize(values, gguf.GGMLQuantizationType(ggml_type)) if raw is None else raw
        raw = raw.view(np.uint8).reshape(rows, -1)
    else:  # every bit pattern of the quants, with finite scales
        raw = rng.integers(0, 256, size=(rows * blocks_per_row, type_size), dtype=np.uint8)
        for off in _F16_FIELDS[ggml_type]:
            raw[:, off : off + 2] = (rng.standard_normal((len(raw), 1)) * 0.1).astype(np.float16).view(np.uint8)
        raw = raw.reshape(rows, -1)
    ref = gguf.dequantize(raw, gguf.GGMLQuantizationType(ggml_type))
    _assert_equal(type_name(ggml_type), dequantize(raw, ggml_type, ref.shape), ref)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf_path):
    return read_gguf(smollm2_gguf_path)


@pytest.fixture(scope="module")
def smollm2_reader(smollm2_gguf_path):
    return gguf.GGUFReader(smollm2_gguf_path)


def test_smollm2_every_tensor_matches_gguf_package(smollm2, smollm2_reader):
    reader = smollm2_reader
    assert {t.name for t in reader.tensors} == set(smollm2.tensor_infos)
    types = set()
    for t in reader.tensors:
        types.add(t.tensor_type.name)
        _assert_equal(t.name, smollm2.read_tensor(t.name), gguf.dequantize(t.data, t.tensor_type))
    assert types == {"F32", "Q8_0", "Q4_1"}


def test_smollm2_metadata_matches_gguf_package(smollm2, smollm2_reader):
    reader = smollm2_reader
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        ref = field.contents()
        assert smollm2.metadata[key] == (pytest.approx(ref) if isinstance(ref, float) else ref), key


# ----------------------------------------------------------------------------------------------------------
# SmolLM2 against transformers' own GGUF loader


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_hf_model):
    return smollm2_hf_model.config, {k: v.numpy() for k, v in smollm2_hf_model.state_dict().items()}


def test_smollm2_tensors_equal_transformers(smollm2, hf_smollm2):
    _, state = hf_smollm2
    cfg = ModelConfig.from_dict(smollm2.config)
    names = [n for n, _ in parameter_shapes(cfg)]
    assert list(smollm2.tensors) == names
    for name in names:
        _assert_equal(name, smollm2.tensors[name], state[name])
    assert cfg.tie_word_embeddings and "lm_head.weight" not in smollm2.tensors


def test_smollm2_config_equals_transformers(smollm2, hf_smollm2):
    hf, _ = hf_smollm2
    ours = smollm2.config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "model_type"):
        assert ours[key] == getattr(hf, key), key
    assert ours["rope_theta"] == hf.rope_parameters["rope_theta"]
    assert ours["architectures"] == ["LlamaForCausalLM"] and ours["rope_scaling"] is None
    assert ModelConfig.from_dict(ours).head_dim == 64


# ----------------------------------------------------------------------------------------------------------
# Synthetic files: round trips for each family, and broken files

_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen2", False), ("qwen3", True)])
def test_round_trip_names_shapes_and_llama_permute(tmp_path, tiny_gguf, arch, tied):
    path = tmp_path / f"{arch}.gguf"
    weights = tiny_gguf(path, arch, tied)
    model = read_gguf(path)
    assert model.config["architectures"] == [_ARCH[arch]]
    assert model.config["tie_word_embeddings"] is tied
    assert model.config["attention_bias"] is (arch == "qwen2")
    assert model.config["rope_theta"] == 5e5 and model.config["head_dim"] == 8
    assert list(model.tensors) == list(weights)
    for name, ref in weights.items():
        _assert_equal(name, model.tensors[name], ref)


@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen2", False), ("qwen3", True)])
def test_tiny_families_equal_transformers(tmp_path, tiny_gguf, arch, tied):
    """Each family's file, loaded by transformers' GGUF loader: same tensors (exactly) and config."""
    transformers = pytest.importorskip("transformers")
    # transformers ignores qwen3.attention.key_length and uses Qwen3Config's default head_dim, 128
    tiny_gguf(tmp_path / "m.gguf", arch, tied, head_dim=128 if arch == "qwen3" else 8)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf")
    state = {k: v.numpy() for k, v in hf.state_dict().items()}
    model = read_gguf(tmp_path / "m.gguf")
    assert set(model.tensors) == set(state) - ({"lm_head.weight"} if tied else set())
    for name, w in model.tensors.items():
        _assert_equal(name, w, state[name])
    for key in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                "tie_word_embeddings"):
        assert model.config[key] == getattr(hf.config, key), key
    hf_head_dim = getattr(hf.config, "head_dim", None) or hf.config.hidden_size // hf.config.num_attention_heads
    assert model.config["head_dim"] == hf_head_dim


def test_quantised_tensors_dequantise_on_access(tmp_path, tiny_gguf):
    path = tmp_path / "q8.gguf"
    weights = tiny_gguf(path, quant=gguf.GGMLQuantizationType.Q8_0)
    model = read_gguf(path)
    q = model.tensors["model.layers.1.mlp.up_proj.weight"]
    ref = weights["model.layers.1.mlp.up_proj.weight"]
    assert q.dtype == np.float32 and q.shape == ref.shape
    assert np.abs(q - ref).max() < 0.02 * np.abs(ref).max()  # Q8_0 error, not garbage


def _llama3_factors(head_dim, theta, factor=32.0, low=1.0, high=4.0, old=8192):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.generate_extra_tensors, verbatim in NumPy."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama3_rope_scaling_recovered_from_rope_freqs(tmp_path, tiny_gguf):
    path = tmp_path / "l3.gguf"
    tiny_gguf(path, rope_freqs=_llama3_factors(8, 5e5))
    scaling = read_gguf(path).config["rope_scaling"]
    assert scaling == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}
    bad = tmp_path / "bad.gguf"
    tiny_gguf(bad, rope_freqs=_llama3_factors(8, 5e5, high=2.0))
    with pytest.raises(GGUFError, match="rope_freqs"):
        read_gguf(bad)


# ---- broken files: one GGUFError (or ConfigError) naming the file and the field ----


@pytest.fixture
def good_file(tmp_path, tiny_gguf):
    path = tmp_path / "good.gguf"
    tiny_gguf(path, quant=gguf.GGMLQuantizationType.Q8_0)
    return path


def _raises(path, pattern):
    with pytest.raises(GGUFError, match=pattern) as info:
        read_gguf(path)
    assert str(path) in str(info.value)
    return info.value


@pytest.mark.parametrize("cut", [2, 10, 30, 300, 900])
def test_truncated_header_or_tables(good_file, cut):
    data = good_file.read_bytes()
    good_file.write_bytes(data[:cut])
    _raises(good_file, "truncated")


def test_truncated_tensor_data(good_file):
    data = good_file.read_bytes()
    good_file.write_bytes(data[:-100])
    _raises(good_file, r"tensor '.*'.*runs past the end of the file")


def test_bad_magic_version_and_empty(good_file, tmp_path):
    data = bytearray(good_file.read_bytes())
    good_file.write_bytes(b"GGML" + data[4:])
    _raises(good_file, "not a GGUF file")
    good_file.write_bytes(data[:4] + (99).to_bytes(4, "little") + data[8:])
    _raises(good_file, "version 99 is not supported")
    good_file.write_bytes(data[:4] + (3).to_bytes(4, "big") + data[8:])
    _raises(good_file, "big-endian")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _raises(empty, "empty")
    with pytest.raises(GGUFError, match="no such file"):
        read_gguf(tmp_path / "missing.gguf")


def _patch_first_tensor_entry(path, field, value):
    """Overwrite n_dims or the type of the first tensor-table entry (found through the gguf reader)."""
    reader = gguf.GGUFReader(str(path))
    t = reader.tensors[0]
    field_obj = reader.tensors[0].field  # ReaderField: parts = name_len, name, n_dims, dims, type, offset
    offsets = {"ndims": field_obj.offset + 8 + len(t.name)}
    offsets["type"] = offsets["ndims"] + 4 + 8 * len(t.shape)
    data = bytearray(path.read_bytes())
    data[offsets[field] : offsets[field] + 4] = int(value).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return t.name


def test_corrupt_tensor_table(good_file):
    name = _patch_first_tensor_entry(good_file, "ndims", 9)
    _raises(good_file, f"'{name}'.*9 dimensions")


def test_unsupported_quant_type(good_file):
    name = _patch_first_tensor_entry(good_file, "type", 16)  # IQ2_XXS
    _raises(good_file, f"tensor '{name}' has type IQ2_XXS, which barerl cannot dequantise")


def test_missing_metadata_key(tmp_path, tiny_gguf):
    path = tmp_path / "nokey.gguf"
    tiny_gguf(path, skip_keys=("block_count",))
    _raises(path, "metadata key 'llama.block_count' is missing")


def test_unsupported_architecture_and_scaling(tmp_path):
    path = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(path), "gemma2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _raises(path, "'general.architecture': 'gemma2' is not supported")


def test_shape_contradicting_metadata(tmp_path, tiny_gguf):
    path = tmp_path / "shape.gguf"
    tiny_gguf(path, feed_forward_length=40)
    _raises(path, r"tensor 'blk.0.ffn_gate.weight' has shape \(64, 32\), the metadata implies \(40, 32\)")


def test_config_errors_name_the_file(tmp_path, tiny_gguf):
    path = tmp_path / "heads.gguf"
    tiny_gguf(path, head_count_kv=3)  # 4 heads cannot share 3 kv heads
    with pytest.raises(ConfigError, match="num_key_value_heads") as info:
        read_gguf(path)
    assert str(path) in str(info.value)
