"""Datasets: loading, shape detection, tokenisation with loss masks, packing, resumable shuffled order.

Design decisions:
- A dataset is a list of row dicts, read whole: JSONL, a JSON array (or a dict of equal-length columns),
  Parquet (through pyarrow, optional), a folder written by `datasets.save_to_disk`, or a Hugging Face Hub
  dataset named ORG/NAME (both through the `datasets` library, optional; a Hub dataset's config and split).
  Every problem names the file, and the line / row and column where there is one.
- Shapes, as TRL names them: `messages` (chat), `prompt` + `completion` (strings or message lists),
  `text` (language modeling), and `prompt` alone (GRPO; the other columns go to the reward functions).
- Loss masks follow TRL's options and defaults: `completion_only_loss` (None: on for prompt-completion
  data) and `assistant_only_loss` (off by default). Assistant spans are found by rendering prefixes of
  the conversation with the tokenizer's own template and taking the longest common prefix with the full
  rendering, so no template needs `{% generation %}` markers. Limitation: a template that renders an
  earlier assistant turn differently once later turns exist (Qwen3 drops old <think> blocks) trains that
  turn only up to where the two renderings diverge (often not at all); the last turn is always exact.
- Packing is greedy in data order: a sequence goes into the current batch if it fits in `max_tokens`,
  else it starts the next one; sequences are never split (one longer than max_tokens is truncated, with a
  warning). Batches never span epochs. Targets are next tokens; a sequence's last token has target 0
  and mask 0, so a packed batch gives exactly the per-token losses of its sequences run one by one.
- Order: `EpochSampler` reshuffles every epoch with a generator seeded by (seed, epoch), so its whole
  state is (epoch, position): checkpoints store that and a resumed run continues with the same examples.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from barerl.formats.paths import is_hub_id
from barerl.model.batch import PackedBatch


class DatasetError(ValueError):
    """A dataset file is missing, malformed, empty, or lacks a needed column."""


# ---------------------------------------------------------------------------------------------------------
# Loading


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                message = f"{path}:{line_no}: malformed JSON line: {e.msg} (column {e.colno})"
                raise DatasetError(message) from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _read_json(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}:{e.lineno}: malformed JSON: {e.msg} (column {e.colno})") from None
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {len(v) for v in data.values()}
        if len(lengths) != 1:
            raise DatasetError(f"{path}: columns have different lengths {sorted(lengths)}")
        data = [dict(zip(data, values)) for values in zip(*data.values())]
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON array of objects or an object of columns")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise DatasetError(f"{path}: row {i} is {type(row).__name__}, expected an object")
    return data


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 -- pyarrow raises several unrelated types for bad files
        raise DatasetError(f"{path}: cannot read as Parquet: {e}") from None


def _read_datasets_folder(path: Path, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{path}: a `datasets` folder needs the datasets library (pip install datasets)") \
            from None
    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise DatasetError(f"{path}: no split {split!r} (has {', '.join(data)})")
        data = data[split]
    return data.to_list()


def _read_hub_dataset(name: str, config: str | None, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{name}: no such file or folder; to take it from the Hugging Face Hub: pip install "
                           "datasets") from None
    try:
        return datasets.load_dataset(name, config, split=split).to_list()
    except Exception as e:  # noqa: BLE001 -- the Hub's errors are of many types (network, access, no such split)
        raise DatasetError(f"{name}: no such file or folder, nor a dataset the Hugging Face Hub gives (config "
                           f"{config!r}, split {split!r}): {type(e).__name__}: {e}") from None


def read_rows(path: str | Path, split: str = "train", config: str | None = None) -> list[dict]:
    """Rows of a JSONL / JSON / Parquet file, a `datasets.save_to_disk` folder (its `split`), or a Hugging Face
    Hub dataset ORG/NAME (its `config` and `split`)."""
    if is_hub_id(path):
        return _read_hub_dataset(str(path), config, split)
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file or folder")
    if path.is_dir():
        if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
            return _read_datasets_folder(path, split)
        raise DatasetError(f"{path}: a folder must be written by datasets.save_to_disk")
    suffix = path.suffix.lower()
    readers = {".jsonl": _read_jsonl, ".jsonlines": _read_jsonl, ".json": _read_json,
               ".parquet": _read_parquet}
    if suffix not in readers:
        raise DatasetError(f"{path}: unknown format {suffix!r}; use .jsonl, .json, .parquet or a datasets "
                           "folder")
    return readers[suffix](path)


def _check_messages(messages, where: str, column: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: column {column!r} must be a non-empty list of messages")
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DatasetError(f"{where}: {column}[{j}] must be a dict with 'role' and 'content', "
                               f"got {m!r:.80}")


def is_conversational(value) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)


@dataclass
class Dataset:
    """Rows and their shape: "messages", "prompt_completion", "text" or "prompt" (GRPO)."""

    rows: list[dict]
    format: str
    source: str

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]


def detect_format(rows: list[dict], task: str = "sft", text_field: str = "text") -> str:
    """The shape of the data, from the first row's columns (TRL's precedence)."""
    columns = rows[0].keys()
    if task == "grpo":
        return "prompt" if "prompt" in columns else ""
    if "messages" in columns:
        return "messages"
    if "prompt" in columns and "completion" in columns:
        return "prompt_completion"
    return "text" if text_field in columns else ""


REQUIRED_COLUMNS = {"messages": ("messages",), "prompt_completion": ("prompt", "completion"),
                    "prompt": ("prompt",)}


def load_dataset(path: str | Path, task: str = "sft", text_field: str = "text", split: str = "train",
                 config: str | None = None) -> Dataset:
    """Read and validate a dataset for `task` ("sft" or "grpo"); errors name the file, row and column."""
    return dataset_from_rows(read_rows(path, split, config), str(path), task, text_field)


def dataset_from_rows(rows: list[dict], source: str = "rows", task: str = "sft",
                      text_field: str = "text") -> Dataset:
    """Validate in-memory rows as `load_dataset` validates a file's (`source` names them in errors)."""
    if not rows:
        raise DatasetError(f"{source}: the dataset is empty")
    fmt = detect_format(rows, task, text_field)
    if not fmt:
        wanted = "'prompt'" if task == "grpo" else f"'messages', 'prompt' + 'completion', or {text_field!r}"
        raise DatasetError(f"{source}: missing column: {task} data needs {wanted}; found {sorted(rows[0])}")
    required = REQUIRED_COLUMNS.get(fmt, (text_field,))
    for i, row in enumerate(rows):
        for column in required:
            if row.get(column) is None:
                raise DatasetError(f"{source}: row {i} has no value in column {column!r}")
            if column == "messages" or is_conversational(row[column]):
                _check_messages(row[column], f"{source}: row {i}", column)
            elif not isinstance(row[column], str):
                raise DatasetError(f"{source}: row {i}: column {column!r} must be a string or a list of "
                                   "messages")
    return Dataset(list(rows), fmt, source)


def train_eval_split(rows: Sequence, eval_fraction: float, seed: int) -> tuple[list, list]:
    """A deterministic held-out split: round(fraction * n) rows (at least 1) chosen by `seed`."""
    if eval_fraction <= 0:
        return list(rows), []
    num_eval = max(1, round(eval_fraction * len(rows)))
    if num_eval >= len(rows):
        raise DatasetError(f"eval split of {eval_fraction} leaves no training rows out of {len(rows)}")
    order = np.random.default_rng(seed).permutation(len(rows))
    held_out = set(order[:num_eval].tolist())
    train = [r for i, r in enumerate(rows) if i not in held_out]
    return train, [r for i, r in enumerate(rows) if i in held_out]


# ---------------------------------------------------------------------------------------------------------
# Tokenisation


@dataclass
class Example:
    """One tokenised sequence; loss_mask[i] = 1 where token i is trained on (predicted from its prefix)."""

    input_ids: list[int]
    loss_mask: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _chat(tokenizer, messages: list[dict], add_generation_prompt: bool, **template_kwargs) -> list[int]:
    if not messages:
        return []
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                        **template_kwargs)
    return list(ids)


def _with_eos(tokenizer, ids: list[int]) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return ids + [eos] if eos is not None and (not ids or ids[-1] != eos) else ids


def _assistant_mask(tokenizer, messages: list[dict], full: list[int]) -> list[int]:
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            start = _common_prefix(_chat(tokenizer, messages[:i], True), full)
            end = _common_prefix(_chat(tokenizer, messages[: i + 1], False), full)
            mask[start:end] = [1] * max(end - start, 0)
    return mask


def tokenize_sft(row: dict, fmt: str, tokenizer, *, max_length: int | None = None,
                 completion_only_loss: bool | None = None, assistant_only_loss: bool = False,
                 text_field: str = "text") -> Example:
    """An SFT row -> Example. Chat data goes through the tokenizer's chat template; plain text and string
    prompt-completion data get EOS appended (as TRL does); truncation keeps the first max_length tokens."""
    if fmt == "messages":
        ids = _chat(tokenizer, row["messages"], False)
        mask = _assistant_mask(tokenizer, row["messages"], ids) if assistant_only_loss else [1] * len(ids)
    elif fmt == "prompt_completion":
        prompt, completion = row["prompt"], row["completion"]
        if is_conversational(prompt):
            prompt_ids = _chat(tokenizer, prompt, True)
            ids = _chat(tokenizer, prompt + completion, False)
        else:
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=True)
            ids = _with_eos(tokenizer, tokenizer.encode(prompt + completion, add_special_tokens=True))
        start = _common_prefix(prompt_ids, ids) if completion_only_loss is not False else 0
        mask = [0] * start + [1] * (len(ids) - start)
    elif fmt == "text":
        ids = _with_eos(tokenizer, tokenizer.encode(row[text_field], add_special_tokens=True))
        mask = [1] * len(ids)
    else:
        raise DatasetError(f"cannot make SFT examples from {fmt!r} data")
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return Example(ids, mask)


def tokenize_dataset(dataset: Dataset, tokenizer, **options) -> list[Example]:
    """Tokenise every row (options as `tokenize_sft`); rows left with no loss token are dropped, warned."""
    examples = [tokenize_sft(row, dataset.format, tokenizer, **options) for row in dataset.rows]
    kept = [e for e in examples if sum(e.loss_mask[1:]) > 0]
    if len(kept) < len(examples):
        warnings.warn(f"{dataset.source}: {len(examples) - len(kept)} of {len(examples)} examples have no "
                      "token to train on (e.g. the prompt fills max_length) and are skipped", stacklevel=2)
    return kept


def encode_prompt(prompt, tokenizer, max_prompt_length: int | None = None,
                  chat_template_kwargs: dict | None = None) -> list[int]:
    """A GRPO prompt's ids: chat template with the generation prompt (and `chat_template_kwargs` as its
    variables, TRL's), or the plain string (no special tokens added, as TRL); truncation keeps the *last*
    max_prompt_length tokens, as TRL does."""
    if is_conversational(prompt):
        ids = _chat(tokenizer, prompt, True, **(chat_template_kwargs or {}))
    else:
        ids = list(tokenizer.encode(prompt, add_special_tokens=False))
    return ids[-max_prompt_length:] if max_prompt_length else ids


# ---------------------------------------------------------------------------------------------------------
# Packing


def _fit(example: Example, max_tokens: int) -> Example:
    if len(example) <= max_tokens:
        return example
    warnings.warn(f"a sequence of {len(example)} tokens is longer than max_tokens={max_tokens}: truncated",
                  stacklevel=3)
    return Example(example.input_ids[:max_tokens], example.loss_mask[:max_tokens])


def next_packed_batch(examples: Sequence[Example], sampler: EpochSampler, max_tokens: int) -> PackedBatch:
    """The next batch in the sampler's order: as many whole sequences as fit in max_tokens, within one
    epoch. Advances the sampler past exactly the sequences it packs."""
    chosen, total, epoch = [], 0, sampler.epoch
    while sampler.epoch == epoch:
        example = _fit(examples[sampler.peek()], max_tokens)
        if chosen and total + len(example) > max_tokens:
            break
        chosen.append(example)
        total += len(example)
        sampler.advance()
    return PackedBatch.from_examples(chosen)


def pack(examples: Sequence[Example], max_tokens: int) -> list[PackedBatch]:
    """All examples, in order, packed into batches of at most max_tokens tokens."""
    if not examples:
        return []
    sampler = EpochSampler(len(examples), shuffle=False)
    batches = []
    while sampler.epoch == 0:
        batches.append(next_packed_batch(examples, sampler, max_tokens))
    return batches


# ---------------------------------------------------------------------------------------------------------
# Order over epochs


class EpochSampler:
    """Dataset indices epoch after epoch, reshuffled each epoch from (seed, epoch); resumable exactly."""

    def __init__(self, num_items: int, seed: int = 0, shuffle: bool = True):
        if num_items < 1:
            raise DatasetError("cannot sample from an empty dataset")
        self.num_items, self.seed, self.shuffle = num_items, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order_epoch, self._order = -1, None

    def order(self) -> np.ndarray:
        """This epoch's permutation of the indices."""
        if self._order_epoch != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._order = rng.permutation(self.num_items) if self.shuffle else np.arange(self.num_items)
            self._order_epoch = self.epoch
        return self._order

    def peek(self) -> int:
        return int(self.order()[self.position])

    def advance(self) -> None:
        self.position += 1
        if self.position == self.num_items:
            self.epoch, self.position = self.epoch + 1, 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        index = self.peek()
        self.advance()
        return index

    def take(self, count: int) -> list[int]:
        """The next `count` indices (crossing into the next epoch when needed, as GRPO prompt batches do)."""
        return [next(self) for _ in range(count)]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "num_items": self.num_items, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict) -> None:
        for key in ("num_items", "seed", "shuffle"):
            if state[key] != getattr(self, key):
                raise DatasetError(f"cannot resume the data order: checkpoint has {key}={state[key]!r}, "
                                   f"this run has {getattr(self, key)!r}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
