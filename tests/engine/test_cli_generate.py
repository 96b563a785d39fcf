"""`barerl generate` end to end on a tiny model folder with a tiny character-level tokenizer."""

import json

import pytest

from barerl.cli import main

CHARS = "abcdefghijklmnopqrstuvwxyz .,!?"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def add_char_tokenizer(folder):
    """tokenizer.json (one token per character, "</s>" = 1) and tokenizer_config.json with a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "</s>": 1, ":": 2, "\n": 3, **{c: i + 4 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "</s>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture
def model_folder(tiny_hf_model, tmp_path):
    folder, _ = tiny_hf_model("qwen3", tmp_path)
    add_char_tokenizer(folder)
    return folder


def test_generate_prompts_file_to_jsonl(model_folder, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    lines = ['"hello there"', '{"prompt_token_ids": [5, 6, 7]}',
             '{"messages": [{"role": "user", "content": "hi"}]}']
    prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    code = main(["generate", "--model", str(model_folder), "--prompts-file", str(prompts),
                 "--output", str(out),
                 "--n", "2", "--temperature", "0.8", "--top-k", "20", "--max-tokens", "6", "--seed", "3",
                 "--ignore-eos", "--logprobs", "--max-model-len", "64", "--block-size", "4"])
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3 and records[1]["prompt_token_ids"] == [5, 6, 7]
    assert records[2]["prompt"] == "user: hi\nassistant:"
    for r in records:
        assert [len(c["token_ids"]) for c in r["outputs"]] == [6, 6]
        assert all(len(c["logprobs"]) == 6 and c["finish_reason"] == "length" for c in r["outputs"])
    err = capsys.readouterr().err
    assert "3 prompts" in err and "36 new tokens" in err and "new tok/s" in err


def test_generate_prompt_with_chat_prints_texts(model_folder, capsys):
    code = main(["generate", "--model", str(model_folder), "--prompt", "hi", "--prompt", "yo", "--chat",
                 "--temperature", "0", "--max-tokens", "4", "--max-model-len", "64"])
    captured = capsys.readouterr()
    assert code == 0
    assert len(captured.out.splitlines()) == 2
    assert "2 prompts" in captured.err and "new tok/s" in captured.err


def test_generate_reports_bad_input_without_a_traceback(model_folder, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_token_ids": []}\n')
    assert main(["generate", "--model", str(model_folder), "--prompts-file", str(bad)]) == 1
    assert "request 0: empty prompt" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_folder), "--prompt", "x", "--top-p", "0"]) == 1
    assert "top_p: must be in (0, 1]" in capsys.readouterr().err
