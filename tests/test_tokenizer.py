"""Tokenizer: ids, decoding and chat templates equal transformers' (SmolLM2 GGUF and a tiny local BPE),
streaming detokenisation, save/load round trips, and clear errors for bad templates and files."""

import json

import pytest

from barerl.formats.gguf import read_gguf
from barerl.tokenizer import (
    ChatTemplateError,
    GGUFTokenizerError,
    IncrementalDetokenizer,
    Tokenizer,
    TokenizerError,
)

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello world",
    "",
    " ",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\n  indented\r\n",
    "emoji 😀🎉👩‍👩‍👧 and CJK 中文字符 and ünïcödé façade",
    "def f(x):\n    return x ** 2  # comment\n\nclass A: pass",
    "digits 1234567890 3.14159 -42 1e-9 007",
    "<|im_start|>user\nspecial tokens inside text<|im_end|>",
    "don't can't I'm we'll they've",
    "a" * 300,
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
    [
        {"role": "user", "content": "Translate 'chat' to French."},
        {"role": "assistant", "content": "« chat » 🐱"},
        {"role": "user", "content": "And to German?\n  With spaces.  "},
    ],
    [
        {"role": "system", "content": "Multi\nline\nsystem"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
    ],
]


# ----------------------------------------------------------------------------------------------------------
# SmolLM2 GGUF vs transformers' GGUF tokenizer


@pytest.fixture(scope="module")
def smollm2_tok(smollm2_gguf_path):
    return Tokenizer.from_gguf(read_gguf(smollm2_gguf_path))


def test_gguf_backend_equals_transformers(smollm2_tok, smollm2_hf_tokenizer):
    ours = json.loads(smollm2_tok.backend.to_str())
    ref = json.loads(smollm2_hf_tokenizer.backend_tokenizer.to_str())
    for key in ref:
        assert ours[key] == ref[key], key


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_gguf_encode_decode_equal_transformers(smollm2_tok, smollm2_hf_tokenizer, add_special_tokens):
    hf = smollm2_hf_tokenizer
    for text in TEXTS:
        ids = smollm2_tok.encode(text, add_special_tokens=add_special_tokens)
        assert ids == hf(text, add_special_tokens=add_special_tokens)["input_ids"], text
        for skip in (False, True):
            assert smollm2_tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_gguf_special_tokens_equal_transformers(smollm2_tok, smollm2_hf_tokenizer):
    hf = smollm2_hf_tokenizer
    for name in ("bos", "eos", "pad", "unk"):
        assert getattr(smollm2_tok, f"{name}_token") == getattr(hf, f"{name}_token"), name
        assert getattr(smollm2_tok, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name
    assert smollm2_tok.eos_token_ids == [2]
    assert smollm2_tok.vocab_size == len(hf) == 49152
    assert smollm2_tok.chat_template == hf.chat_template


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_gguf_chat_template_equals_transformers(smollm2_tok, smollm2_hf_tokenizer, conv, add_generation_prompt):
    messages, hf = CONVERSATIONS[conv], smollm2_hf_tokenizer
    text = smollm2_tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    assert text == hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    ids = smollm2_tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    ref = hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, return_dict=False)
    assert ids == ref


def test_continue_final_message_equals_transformers(smollm2_tok, smollm2_hf_tokenizer):
    messages = [{"role": "user", "content": "Count to 3."}, {"role": "assistant", "content": "1, 2,"}]
    ours = smollm2_tok.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    ref = smollm2_hf_tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    assert ours == ref and ours.endswith("1, 2,")


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_incremental_detokenizer_concatenates_to_decode(smollm2_tok, skip_special_tokens):
    streams = [smollm2_tok.encode(t) for t in TEXTS]
    streams.append(smollm2_tok.apply_chat_template(CONVERSATIONS[2]))
    for ids in streams:
        det = IncrementalDetokenizer(smollm2_tok, skip_special_tokens=skip_special_tokens)
        pieces = [det.add(i) for i in ids]
        pieces.append(det.flush())
        assert "".join(pieces) == smollm2_tok.decode(ids, skip_special_tokens=skip_special_tokens)
        assert not any("\ufffd" in p for p in pieces)  # never half a character


def test_incremental_detokenizer_holds_back_partial_utf8(smollm2_tok):
    ids = smollm2_tok.encode("😀")
    assert len(ids) > 1  # the emoji's 4 bytes span several byte-level tokens
    det = IncrementalDetokenizer(smollm2_tok)
    assert [det.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert det.add(ids[-1]) == "😀"
    det.add(ids[0])  # a sequence that stops mid-character: flush gives what decode gives
    assert det.flush() == smollm2_tok.decode(ids[:1])


def test_gguf_save_pretrained_loads_in_transformers(smollm2_tok, smollm2_hf_tokenizer, tmp_path):
    smollm2_tok.save_pretrained(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = Tokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        ref = smollm2_hf_tokenizer(text)["input_ids"]
        assert hf(text)["input_ids"] == ours.encode(text) == ref, text
    for messages in CONVERSATIONS:
        ref = smollm2_hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        assert hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False) == ref
        assert ours.apply_chat_template(messages, add_generation_prompt=True) == ref
    assert (hf.bos_token, hf.eos_token, hf.pad_token) == (ours.bos_token, ours.eos_token, ours.pad_token)


@pytest.mark.parametrize("pre,add_bos", [("llama-bpe", True), ("qwen2", False)])
def test_gguf_conversion_branches_equal_transformers(smollm2_tok, smollm2_gguf_path, tiny_gguf, tmp_path, pre,
                                                     add_bos):
    """SmolLM2's vocabulary re-labelled like a Llama 3 / Qwen2 file: the split regex per `pre`, BOS added by
    the file's flag, a user-defined token, and a "control" token outside the byte alphabet (which transformers
    skips as a llama.cpp mislabel)."""
    spec = read_gguf(smollm2_gguf_path).tokenizer_spec
    tokens, types = list(spec.tokens), list(spec.token_types)
    hello = smollm2_tok.backend.token_to_id("hello")
    types[hello] = 4  # USER_DEFINED: matched whole, not special
    tokens += ["<think>", "<|ctrl ✓|>"]
    types += [4, 3]
    path = tmp_path / f"{pre}.gguf"
    tiny_gguf(path, tokenizer={"tokens": tokens, "token_types": types, "merges": spec.merges, "pre": pre,
                               "bos": 1, "eos": 2, "add_bos": add_bos})
    ours = Tokenizer.from_gguf(read_gguf(path))
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    ref = json.loads(hf.backend_tokenizer.to_str())
    assert json.loads(ours.backend.to_str()) == ref
    for text in [*TEXTS, "sayhello to 123456 hello <think>x</think>", "<|ctrl ✓|>"]:
        ids = ours.encode(text)
        assert ids == hf(text)["input_ids"], text
        assert ours.decode(ids) == hf.decode(ids)
    assert (ours.encode("hi")[0] == 1) is add_bos


def test_qwen2_style_folder_equals_transformers(smollm2_gguf_path, tmp_path):
    """A folder shaped like Qwen2/Qwen3's (NFC + split regex + ByteLevel, tokenizer_class Qwen2Tokenizer, which
    transformers v5 rebuilds from vocab and merges instead of loading tokenizer.json as is)."""
    import dataclasses

    from tokenizers import normalizers, processors

    from barerl.tokenizer.from_gguf import build_backend

    model = read_gguf(smollm2_gguf_path)
    backend = build_backend(dataclasses.replace(model.tokenizer_spec, pre="qwen2"))
    backend.normalizer = normalizers.NFC()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>", "unk_token": None,
              "pad_token": "<|endoftext|>", "chat_template": model.tokenizer_spec.chat_template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    hf, ours = transformers.AutoTokenizer.from_pretrained(tmp_path), Tokenizer.from_pretrained(tmp_path)
    assert json.loads(ours.backend.to_str()) == json.loads(hf.backend_tokenizer.to_str())
    for text in [*TEXTS, "ｆｕｌｌ width ﬁ ligature e\u0301"]:
        assert ours.encode(text) == hf(text)["input_ids"], text
    for messages in CONVERSATIONS:
        ref = hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        assert ours.apply_chat_template(messages, add_generation_prompt=True) == ref
    for name in ("bos_token", "eos_token", "pad_token", "unk_token", "eos_token_id", "pad_token_id"):
        assert getattr(ours, name) == getattr(hf, name), name


def test_gpt2_class_folder_with_default_special_tokens(smollm2_tok, tmp_path):
    """SmolLM2's own folder names GPT2Tokenizer; with bos/unk left out, transformers uses that class's defaults."""
    smollm2_tok.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="GPT2Tokenizer", add_prefix_space=False)
    del config["bos_token"], config["unk_token"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "special_tokens_map.json").unlink()
    hf, ours = transformers.AutoTokenizer.from_pretrained(tmp_path), Tokenizer.from_pretrained(tmp_path)
    assert json.loads(ours.backend.to_str()) == json.loads(hf.backend_tokenizer.to_str())
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.bos_token == "<|endoftext|>"
    for text in TEXTS:
        assert ours.encode(text) == hf(text)["input_ids"], text


# ----------------------------------------------------------------------------------------------------------
# A tiny byte-level BPE trained here (no download): from_pretrained / save_pretrained and template rendering

TINY_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}"
    "{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% if m['role'] == 'system' and not loop.first %}{{ raise_exception('system must come first') }}{% endif %}"
    "<|{{ m['role'] }}|>\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim }}{% endgeneration %}"
    "{% else %}{{ m['content'] }}{% endif %}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    "{{ '#' ~ ns.n if count_turns is defined and count_turns }}"
)


def _tiny_folder(tmp_path, **config):
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = ["the quick brown fox jumps over the lazy dog", "hello world, hello tokenizer", "1 + 1 = 2"] * 20
    backend.train_from_iterator(corpus, trainer)
    # BOS comes from tokenizer.json's post-processor (as in Llama 3); transformers v5 ignores add_bos_token then
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    folder = tmp_path / "tiny"
    folder.mkdir(parents=True)
    backend.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "pad_token": "<pad>", "add_bos_token": False, "chat_template": TINY_TEMPLATE, **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture
def tiny(tmp_path):
    folder = _tiny_folder(tmp_path)
    return folder, Tokenizer.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(folder)


def test_tiny_from_pretrained_equals_transformers(tiny):
    _, ours, hf = tiny
    for text in [*TEXTS, "hello world </s> <s>"]:
        for add in (True, False):
            assert ours.encode(text, add_special_tokens=add) == hf(text, add_special_tokens=add)["input_ids"]
    assert ours.encode("hello")[0] == ours.bos_token_id == hf.bos_token_id  # tokenizer.json's post-processor
    assert (ours.eos_token_id, ours.pad_token_id) == (hf.eos_token_id, hf.pad_token_id)


def test_tiny_template_features_equal_transformers(tiny):
    _, ours, hf = tiny
    tools = [{"type": "function", "function": {"name": "add", "description": "a < b & c", "parameters": {}}}]
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "  world  ", "tool_calls": None}]
    for kwargs in ({}, {"add_generation_prompt": True}, {"tools": tools}, {"count_turns": True}):
        ref = hf.apply_chat_template(messages, tokenize=False, **kwargs)
        assert ours.apply_chat_template(messages, tokenize=False, **kwargs) == ref, kwargs
        ids = hf.apply_chat_template(messages, return_dict=False, **kwargs)
        assert ours.apply_chat_template(messages, **kwargs) == ids
    assert '"a < b & c"' in ours.apply_chat_template(messages, tokenize=False, tools=tools)  # no HTML escaping


def test_tiny_save_pretrained_round_trip(tiny, tmp_path):
    _, ours, _ = tiny
    out = tmp_path / "saved"
    ours.save_pretrained(out)
    assert {p.name for p in out.iterdir()} == {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    again, hf = Tokenizer.from_pretrained(out), transformers.AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "hello world"}]
    for text in TEXTS:
        assert again.encode(text) == ours.encode(text) == hf(text)["input_ids"]
    assert again.apply_chat_template(messages) == hf.apply_chat_template(messages, return_dict=False)
    assert again.chat_template == ours.chat_template == hf.chat_template


def test_chat_template_jinja_file_takes_precedence(tmp_path):
    folder = _tiny_folder(tmp_path)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    tok = Tokenizer.from_pretrained(folder)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "[x]"
    assert str(folder / "chat_template.jinja") in tok.source


# ----------------------------------------------------------------------------------------------------------
# Errors


def test_template_errors_name_source_and_message(tiny, tmp_path):
    folder, ours, _ = tiny
    bad_order = [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="system must come first") as info:
        ours.apply_chat_template(bad_order)
    assert str(folder / "tokenizer_config.json") in str(info.value)
    broken = _tiny_folder(tmp_path / "b", chat_template="{% for m in messages %}{{ m['content'] }")
    with pytest.raises(ChatTemplateError, match="syntax error at line 1"):
        Tokenizer.from_pretrained(broken).apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        ours.apply_chat_template([{"role": "user", "content": "x"}], chat_template="{{ messages[5]['x'].y() }}")
    with pytest.raises(ChatTemplateError, match="chat template failed"):  # the sandbox refuses internals
        ours.apply_chat_template([{"role": "user", "content": "x"}], chat_template="{{ ''.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Tokenizer(ours.backend).apply_chat_template([{"role": "user", "content": "x"}])


def test_bad_tokenizer_files(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.json: no such file"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot be read as a tokenizer"):
        Tokenizer.from_pretrained(tmp_path)
    folder = _tiny_folder(tmp_path)
    (folder / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(TokenizerError, match="tokenizer_config.json: not valid JSON"):
        Tokenizer.from_pretrained(folder)


def test_unsupported_gguf_vocabulary(smollm2_gguf_path):
    import dataclasses

    model = read_gguf(smollm2_gguf_path)
    model.tokenizer_spec = dataclasses.replace(model.tokenizer_spec, model="llama")
    with pytest.raises(GGUFTokenizerError, match="'tokenizer.ggml.model' is 'llama'"):
        Tokenizer.from_gguf(model)
