"""Datasets: formats, errors naming file/line/column, loss masks, packing, resumable order."""

import json
import re
import sys
from typing import ClassVar

import numpy as np
import pytest
from train_helpers import stand_in_datasets

from barerl.train.data import (
    DatasetError,
    EpochSampler,
    Example,
    PackedBatch,
    dataset_from_rows,
    encode_prompt,
    load_dataset,
    next_packed_batch,
    pack,
    read_rows,
    tokenize_dataset,
    tokenize_sft,
    train_eval_split,
)


class TinyTokenizer:
    """Stand-in tokenizer: special tokens have ids 1..6, a character c has id ord(c) (>= 32).

    Chat template: <|role|>content<|end|> per message, then <|assistant|> for the generation prompt.
    """

    SPECIAL: ClassVar[dict] = {"<s>": 1, "</s>": 2, "<|user|>": 3, "<|assistant|>": 4, "<|system|>": 5,
                               "<|end|>": 6}
    bos_token_id, eos_token_id = 1, 2

    def encode(self, text, add_special_tokens=True):
        pieces = re.split("(" + "|".join(map(re.escape, self.SPECIAL)) + ")", text)
        ids = [t for p in pieces for t in ([self.SPECIAL[p]] if p in self.SPECIAL else [ord(c) for c in p])]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        text = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        text += "<|assistant|>" if add_generation_prompt else ""
        return self.encode(text, add_special_tokens=False) if tokenize else text


def ids(text):
    return [ord(c) for c in text]


U, A, S, END = 3, 4, 5, 6
CHAT = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "ok"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------------------------------------------------
# Loading and shapes


def test_formats_are_detected(tmp_path):
    cases = {
        "messages": [{"messages": CHAT}],
        "prompt_completion": [{"prompt": "2+2=", "completion": "4"},
                              {"prompt": [{"role": "user", "content": "2+2?"}],
                               "completion": [{"role": "assistant", "content": "4"}]}],
        "text": [{"text": "hello"}],
    }
    for fmt, rows in cases.items():
        assert load_dataset(write_jsonl(tmp_path / f"{fmt}.jsonl", rows)).format == fmt
    grpo = load_dataset(write_jsonl(tmp_path / "g.jsonl", [{"prompt": "1+1", "answer": "2"}]), task="grpo")
    assert grpo.format == "prompt" and grpo[0]["answer"] == "2"


def test_json_array_columns_and_blank_lines(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"text": "x"}, {"text": "y"}]))
    (tmp_path / "c.json").write_text(json.dumps({"prompt": ["p", "q"], "answer": ["1", "2"]}))
    (tmp_path / "b.jsonl").write_text('{"text": "x"}\n\n{"text": "y"}\n')
    assert [r["text"] for r in read_rows(tmp_path / "a.json")] == ["x", "y"]
    assert read_rows(tmp_path / "c.json") == [{"prompt": "p", "answer": "1"}, {"prompt": "q", "answer": "2"}]
    assert len(read_rows(tmp_path / "b.jsonl")) == 2


def test_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"prompt": ["a", "b"], "completion": ["c", "d"]}), tmp_path / "d.parquet")
    dataset = load_dataset(tmp_path / "d.parquet")
    assert dataset.format == "prompt_completion" and dataset[1] == {"prompt": "b", "completion": "d"}


def test_parquet_without_pyarrow_says_install(tmp_path, monkeypatch):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DatasetError, match=r"d.parquet: reading Parquet needs pyarrow \(pip install pyarrow"):
        read_rows(tmp_path / "d.parquet")


def test_datasets_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(str(tmp_path / "ds"))
    assert load_dataset(tmp_path / "ds").rows == [{"text": "a"}, {"text": "b"}]
    splits = {"train": datasets.Dataset.from_dict({"prompt": ["p"]}),
              "test": datasets.Dataset.from_dict({"prompt": ["q"]})}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "dd"))
    assert load_dataset(tmp_path / "dd", task="grpo", split="test").rows == [{"prompt": "q"}]
    with pytest.raises(DatasetError, match=r"dd: no split 'eval' \(has train, test\)"):
        load_dataset(tmp_path / "dd", split="eval")


def test_hub_datasets_come_through_the_datasets_library(tmp_path, monkeypatch):
    calls = stand_in_datasets(monkeypatch, splits={"test": [{"prompt": "p", "answer": "1"}]})
    assert load_dataset("openai/gsm8k", task="grpo", split="test", config="main").rows == [
        {"prompt": "p", "answer": "1"}]
    assert calls == [("openai/gsm8k", "main", "test")]
    (tmp_path / "openai").mkdir()
    (tmp_path / "openai" / "gsm8k").write_text('{"prompt": "local"}\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match="openai/gsm8k: unknown format"):  # a local path wins
        load_dataset("openai/gsm8k", task="grpo")
    assert len(calls) == 1


def test_hub_dataset_errors_name_the_dataset_and_the_fix(monkeypatch):
    stand_in_datasets(monkeypatch, error=ValueError("Config name is missing"))
    with pytest.raises(DatasetError, match=r"openai/gsm8k: no such file or folder, nor a dataset the Hugging Face "
                                           r"Hub gives \(config None, split 'train'\): ValueError: Config name"):
        read_rows("openai/gsm8k")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DatasetError, match="openai/gsm8k: no such file or folder; .* pip install datasets"):
        read_rows("openai/gsm8k")
    with pytest.raises(DatasetError, match="^data/train.jsonl: no such file or folder$"):  # a file's name
        read_rows("data/train.jsonl")


def test_malformed_jsonl_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n{"text": oops}\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:3: malformed JSON line"):
        load_dataset(path)
    path.write_text('{"text": "a"}\n[1, 2]\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: expected a JSON object, got list"):
        load_dataset(path)
    (tmp_path / "bad.json").write_text('[{"text": "a"},\n {"text" "b"}]')
    with pytest.raises(DatasetError, match=r"bad.json:2: malformed JSON"):
        load_dataset(tmp_path / "bad.json")


@pytest.mark.parametrize("content", ["", "\n\n", "[]"])
def test_empty_file(tmp_path, content):
    path = tmp_path / ("empty.json" if content == "[]" else "empty.jsonl")
    path.write_text(content)
    with pytest.raises(DatasetError, match=r"empty.jsonl?: the dataset is empty"):
        load_dataset(path)


def test_missing_columns_are_named(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "1+1", "answer": "2"}])
    with pytest.raises(DatasetError, match=r"d.jsonl: missing column: grpo data needs 'prompt'; found \['an"):
        load_dataset(path, task="grpo")
    with pytest.raises(DatasetError, match=r"d.jsonl: missing column: sft data needs 'messages'"):
        load_dataset(path)
    path = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "c"}])
    with pytest.raises(DatasetError, match=r"e.jsonl: row 1 has no value in column 'completion'"):
        load_dataset(path)
    path = write_jsonl(tmp_path / "f.jsonl", [{"messages": [{"role": "user"}]}])
    with pytest.raises(DatasetError, match=r"f.jsonl: row 0: messages\[0\] must be a dict with 'role' and"):
        load_dataset(path)


def test_in_memory_rows_are_validated_too():
    assert dataset_from_rows([{"prompt": "p"}], "demo", task="grpo").format == "prompt"
    with pytest.raises(DatasetError, match=r"demo: row 1 has no value in column 'text'"):
        dataset_from_rows([{"text": "a"}, {"text": None}], "demo")


def test_unknown_format_and_missing_file(tmp_path):
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match=r"d.csv: unknown format '.csv'"):
        read_rows(tmp_path / "d.csv")
    with pytest.raises(DatasetError, match="nope.jsonl: no such file"):
        read_rows(tmp_path / "nope.jsonl")


# ---------------------------------------------------------------------------------------------------------
# Tokenisation and loss masks


def test_assistant_only_loss_masks_assistant_turns():
    tok = TinyTokenizer()
    example = tokenize_sft({"messages": CHAT}, "messages", tok, assistant_only_loss=True)
    expected_ids = [S, *ids("s"), END, U, *ids("hi"), END, A, *ids("yo"), END,
                    U, *ids("q"), END, A, *ids("ok"), END]
    assert example.input_ids == expected_ids
    expected_mask = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1]  # "yo<|end|>", "ok<|end|>"
    assert example.loss_mask == expected_mask
    assert tokenize_sft({"messages": CHAT}, "messages", tok).loss_mask == [1] * len(expected_ids)


def test_completion_only_loss_strings_and_chat():
    tok = TinyTokenizer()
    example = tokenize_sft({"prompt": "2+2=", "completion": "4"}, "prompt_completion", tok)
    assert example.input_ids == [1, *ids("2+2=4"), 2]  # BOS ... EOS appended
    assert example.loss_mask == [0, 0, 0, 0, 0, 1, 1]
    row = {"prompt": "2+2=", "completion": "4"}
    full = tokenize_sft(row, "prompt_completion", tok, completion_only_loss=False)
    assert full.loss_mask == [1] * 7
    row = {"prompt": [{"role": "user", "content": "hi"}],
           "completion": [{"role": "assistant", "content": "yo"}]}
    chat = tokenize_sft(row, "prompt_completion", tok)
    assert chat.input_ids == [U, *ids("hi"), END, A, *ids("yo"), END]
    assert chat.loss_mask == [0, 0, 0, 0, 0, 1, 1, 1]


def test_text_eos_and_truncation():
    tok = TinyTokenizer()
    assert tokenize_sft({"text": "abc"}, "text", tok).input_ids == [1, *ids("abc"), 2]
    cut = tokenize_sft({"prompt": "abc", "completion": "def"}, "prompt_completion", tok, max_length=5)
    assert cut.input_ids == [1, *ids("abcd")] and cut.loss_mask == [0, 0, 0, 0, 1]
    assert tokenize_sft({"body": "x"}, "text", tok, text_field="body").input_ids == [1, ord("x"), 2]


def test_tokenize_dataset_drops_examples_without_loss(tmp_path):
    dataset = load_dataset(write_jsonl(tmp_path / "d.jsonl", [{"prompt": "long prompt", "completion": "x"},
                                                              {"prompt": "p", "completion": "x"}]))
    with pytest.warns(UserWarning, match="1 of 2 examples have no token to train on"):
        examples = tokenize_dataset(dataset, TinyTokenizer(), max_length=6)
    assert len(examples) == 1 and examples[0].input_ids[:2] == [1, ord("p")]


def test_encode_prompt_keeps_the_end():
    tok = TinyTokenizer()
    assert encode_prompt("abcdef", tok, max_prompt_length=3) == ids("def")
    assert encode_prompt([{"role": "user", "content": "hi"}], tok) == [U, *ids("hi"), END, A]


QWEN_LIKE = (
    "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}"
    "{% set content = m.content.split('</think>')[-1].lstrip() %}"
    "{% else %}{% set content = m.content %}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_assistant_spans_with_the_real_tokenizer_and_a_history_rewriting_template():
    """barerl's Tokenizer with a template that drops <think> from earlier assistant turns (as Qwen3's does):
    the last turn is masked exactly; an earlier turn is masked where its renderings agree."""
    from tokenizers import AddedToken, models
    from tokenizers import Tokenizer as Backend

    from barerl.tokenizer.tokenizer import Tokenizer

    chars = sorted(set("abcdefghijklmnopqrstuvwxyz <>/\n?"))
    backend = Backend(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    backend.add_special_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>")])
    tok = Tokenizer(backend, {"eos_token": "<|im_end|>"}, chat_template=QWEN_LIKE)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>x</think> yo"},
                {"role": "user", "content": "and"}, {"role": "assistant", "content": "<think>y</think> ok"}]
    example = tokenize_sft({"messages": messages}, "messages", tok, assistant_only_loss=True)
    trained = [t if m else None for t, m in zip(example.input_ids, example.loss_mask)]
    spans = "".join("\0" if t is None else tok.decode([t]) for t in trained).split("\0")
    assert [s for s in spans if s] == ["<think>y</think> ok<|im_end|>\n"]  # earlier turn: diverges at once


# ---------------------------------------------------------------------------------------------------------
# Packing


def test_packed_batch_layout():
    a, b = Example([10, 11, 12], [0, 1, 1]), Example([20, 21], [1, 1])
    batch = PackedBatch.from_examples([a, b])
    assert batch.input_ids.tolist() == [10, 11, 12, 20, 21]
    assert batch.targets.tolist() == [11, 12, 0, 21, 0]
    assert batch.loss_mask.tolist() == [1, 1, 0, 1, 0]
    assert batch.positions.tolist() == [0, 1, 2, 0, 1]
    assert batch.cu_seqlens.tolist() == [0, 3, 5] and batch.num_sequences == 2 and batch.num_loss_tokens == 3
    assert batch.input_ids.dtype == np.int32 and batch.loss_mask.dtype == np.float32
    assert batch.cu_seqlens.dtype == np.int32 and batch.positions.dtype == np.int32


def _random_examples(rng, count, max_len=12, vocab=50):
    out = []
    for _ in range(count):
        n = int(rng.integers(1, max_len + 1))
        mask = (rng.uniform(size=n) > 0.3).astype(int).tolist()
        out.append(Example(rng.integers(0, vocab, n).tolist(), mask))
    return out


def test_packing_keeps_sequences_whole_and_the_loss_unchanged():
    rng = np.random.default_rng(0)
    examples = _random_examples(rng, 40)
    table = np.log(rng.dirichlet(np.ones(50), size=50))  # a bigram "model": logp(next | current)
    unpacked = sum(table[e.input_ids[i], e.input_ids[i + 1]] * e.loss_mask[i + 1]
                   for e in examples for i in range(len(e) - 1))
    batches = pack(examples, max_tokens=30)
    packed = sum(float((table[b.input_ids, b.targets] * b.loss_mask).sum()) for b in batches)
    assert packed == pytest.approx(unpacked, rel=1e-12)
    assert all(b.num_tokens <= 30 for b in batches)
    assert sum(b.num_sequences for b in batches) == 40
    rebuilt = [b.input_ids[s:e].tolist()
               for b in batches for s, e in zip(b.cu_seqlens[:-1], b.cu_seqlens[1:])]
    assert rebuilt == [e.input_ids for e in examples]  # in order, none split


def test_too_long_sequence_is_truncated_with_warning():
    with pytest.warns(UserWarning, match="12 tokens is longer than max_tokens=5"):
        batches = pack([Example(list(range(12)), [1] * 12), Example([1, 2], [1, 1])], max_tokens=5)
    assert [b.input_ids.tolist() for b in batches] == [[0, 1, 2, 3, 4], [1, 2]]


# ---------------------------------------------------------------------------------------------------------
# Order, resume, split


def test_sampler_is_seeded_per_epoch():
    s = EpochSampler(10, seed=3)
    first, second = s.take(10), s.take(10)
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10)) and first != second
    assert EpochSampler(10, seed=3).take(20) == first + second
    assert EpochSampler(10, seed=4).take(10) != first
    assert EpochSampler(4, shuffle=False).take(6) == [0, 1, 2, 3, 0, 1]


def test_resume_gives_the_same_next_batches():
    examples = _random_examples(np.random.default_rng(1), 25)
    reference = EpochSampler(len(examples), seed=7)
    batches = [next_packed_batch(examples, reference, 40) for _ in range(12)]  # crosses epochs
    assert reference.epoch >= 1

    run = EpochSampler(len(examples), seed=7)
    for _ in range(5):
        next_packed_batch(examples, run, 40)
    state = json.loads(json.dumps(run.state_dict()))  # as a checkpoint stores it
    resumed = EpochSampler(len(examples), seed=7)
    resumed.load_state_dict(state)
    for expected in batches[5:]:
        got = next_packed_batch(examples, resumed, 40)
        assert got.input_ids.tolist() == expected.input_ids.tolist()
    with pytest.raises(DatasetError, match="checkpoint has seed=7, this run has 8"):
        EpochSampler(len(examples), seed=8).load_state_dict(state)


def test_batches_do_not_span_epochs():
    examples = [Example([1, 2, 3], [1, 1, 1]) for _ in range(5)]
    sampler = EpochSampler(5, seed=0)
    sizes = [next_packed_batch(examples, sampler, 6).num_sequences for _ in range(4)]
    assert sizes == [2, 2, 1, 2]


def test_train_eval_split():
    rows = list(range(100))
    train, held_out = train_eval_split(rows, 0.1, seed=0)
    assert len(held_out) == 10 and sorted(train + held_out) == rows
    assert train_eval_split(rows, 0.1, seed=0) == (train, held_out)
    assert train_eval_split(rows, 0.1, seed=1)[1] != held_out
    assert train_eval_split(rows, 0.0, seed=0) == (rows, [])
    with pytest.raises(DatasetError, match="leaves no training rows"):
        train_eval_split([1], 0.5, seed=0)
