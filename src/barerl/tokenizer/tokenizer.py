"""`Tokenizer`: a `tokenizers` tokenizer plus what transformers keeps beside it (special tokens, chat template).

Design decisions:
- The Rust `tokenizers` library does all encoding and decoding; this class only carries the Hugging Face
  conventions around it, so that our ids equal `AutoTokenizer`'s: named special tokens from
  tokenizer_config.json (registered as special added tokens when the tokenizer.json lacks them, as
  transformers does), and `apply_chat_template` tokenizing its text with `add_special_tokens=False`.
- Whether BOS/EOS are added is the post-processor's business. From a folder, tokenizer.json's post-processor
  is authoritative and tokenizer_config.json's add_bos_token / add_eos_token are ignored, as transformers v5
  (the oracle) does; from a GGUF, the file's add_bos_token / add_eos_token build the post-processor.
- `clean_up_tokenization_spaces` is ignored: transformers v5 ignores it for BPE models, and all our model
  families are BPE.
- `vocab_size` counts every id the tokenizer can produce (added tokens included), which is what the
  model's embedding must cover; `len(hf_tokenizer)` in transformers terms.
- save_pretrained writes tokenizer.json, tokenizer_config.json (with the chat template) and
  special_tokens_map.json, which `AutoTokenizer.from_pretrained` loads as a plain fast tokenizer.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from barerl.tokenizer.chat_template import ChatTemplateError, render_chat
from barerl.tokenizer.from_gguf import build_backend, template_processor

if TYPE_CHECKING:
    from barerl.formats.gguf import GGUFModel

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
# transformers' per-class defaults for special tokens that tokenizer_config.json leaves out (not for explicit nulls)
_ENDOFTEXT = "<|endoftext|>"
_CLASS_DEFAULTS = {
    "GPT2Tokenizer": {"bos_token": _ENDOFTEXT, "eos_token": _ENDOFTEXT, "unk_token": _ENDOFTEXT},
    "Qwen2Tokenizer": {"eos_token": _ENDOFTEXT, "unk_token": _ENDOFTEXT, "pad_token": _ENDOFTEXT},
}


class TokenizerError(ValueError):
    """Tokenizer files are missing or malformed."""


class Tokenizer:
    """Encode/decode text, render chat prompts, know the special tokens.

    backend: the `tokenizers.Tokenizer` (modified in place: named special tokens get registered);
    special_tokens: {"bos_token": ..., "eos_token": ..., "unk_token": ..., "pad_token": ...} (strings or None);
    add_bos_token / add_eos_token: when either is given, the post-processor is rebuilt to add exactly those.
    """

    def __init__(
        self,
        backend: Backend,
        special_tokens: dict[str, str | None] | None = None,
        chat_template: str | None = None,
        source: str = "tokenizer",
        add_bos_token: bool | None = None,
        add_eos_token: bool | None = None,
    ):
        self.backend = backend
        self.special_tokens = {name: (special_tokens or {}).get(name) for name in SPECIAL_TOKEN_NAMES}
        self.chat_template = chat_template
        self.source = source  # where the tokenizer (and its chat template) came from, for messages
        self._register_special_tokens()
        if add_bos_token is not None or add_eos_token is not None or backend.post_processor is None:
            self.backend.post_processor = template_processor(
                self.bos_token if add_bos_token else None, self.eos_token if add_eos_token else None, backend
            )

    def _register_special_tokens(self) -> None:
        """Named special tokens not yet among the added tokens become special added tokens (as in transformers)."""
        added = {t.content for t in self.backend.get_added_tokens_decoder().values()}
        missing = [t for t in self.special_tokens.values() if t is not None and t not in added]
        if missing:
            self.backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])

    # ---- construction ----------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> Tokenizer:
        """Load tokenizer.json + tokenizer_config.json (+ chat_template.jinja, special_tokens_map.json)."""
        folder = os.fspath(folder)
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(path):
            raise TokenizerError(f"{path}: no such file (a model folder needs a tokenizer.json)")
        try:
            backend = Backend.from_file(path)
        except Exception as e:  # noqa: BLE001 (the Rust library raises plain Exception for bad files)
            raise TokenizerError(f"{path}: cannot be read as a tokenizer: {e}") from None
        config = _read_json(os.path.join(folder, "tokenizer_config.json"))
        special_map = _read_json(os.path.join(folder, "special_tokens_map.json"))
        defaults = _CLASS_DEFAULTS.get(str(config.get("tokenizer_class", "")).removesuffix("Fast"), {})
        special = {n: _token_content(config.get(n, special_map.get(n, defaults.get(n)))) for n in SPECIAL_TOKEN_NAMES}
        template, template_source = config.get("chat_template"), os.path.join(folder, "tokenizer_config.json")
        jinja_path = os.path.join(folder, "chat_template.jinja")
        if os.path.isfile(jinja_path):  # transformers v5 saves the template here and prefers it
            with open(jinja_path, encoding="utf-8") as f:
                template, template_source = f.read(), jinja_path
        if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]: take "default"
            template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
        if template is not None and not isinstance(template, str):
            raise TokenizerError(f"{template_source}: field 'chat_template' must be a string")
        return cls(
            backend,
            special,
            template,
            source=template_source if template is not None else path,
        )

    @classmethod
    def from_gguf(cls, model: GGUFModel) -> Tokenizer:
        """From a `barerl.formats.gguf.GGUFModel` (its vocabulary, merges, special ids and chat template)."""
        spec = model.tokenizer_spec
        if spec is None:
            raise TokenizerError(f"{model.path}: no tokenizer in the file (metadata 'tokenizer.ggml.tokens')")
        ids = {"bos_token": spec.bos_token_id, "eos_token": spec.eos_token_id}
        ids.update(unk_token=spec.unk_token_id, pad_token=spec.pad_token_id)
        for name, i in ids.items():
            if i is not None and not 0 <= i < len(spec.tokens):
                raise TokenizerError(f"{model.path}: {name} id {i} is outside the vocabulary ({len(spec.tokens)})")
        special = {name: spec.tokens[i] if i is not None else None for name, i in ids.items()}
        return cls(
            build_backend(spec),
            special,
            spec.chat_template,
            source=f"{model.path} (tokenizer.chat_template)",
            add_bos_token=spec.add_bos_token,
            add_eos_token=spec.add_eos_token,
        )

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        folder = os.fspath(folder)
        os.makedirs(folder, exist_ok=True)
        self.backend.save(os.path.join(folder, "tokenizer.json"))
        named = {k: v for k, v in self.special_tokens.items() if v is not None}
        config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **named}
        config.update(clean_up_tokenization_spaces=False, model_max_length=int(1e30))
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        _write_json(os.path.join(folder, "tokenizer_config.json"), config)
        _write_json(os.path.join(folder, "special_tokens_map.json"), named)

    # ---- encoding --------------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        conversation: list[dict],
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        tools: list[dict] | None = None,
        chat_template: str | None = None,
        continue_final_message: bool = False,
        **kwargs: Any,
    ) -> list[int] | str:
        """The conversation in the model's prompt format: token ids (or the text with tokenize=False).

        Extra keyword arguments (`enable_thinking=False`, `documents=...`) become template variables, and
        override the special tokens (`bos_token`, `eos_token`, ...) the template also sees.
        """
        template = chat_template if chat_template is not None else self.chat_template
        source = "chat_template argument" if chat_template is not None else self.source
        if template is None:
            raise ChatTemplateError(f"{self.source}: the tokenizer has no chat template")
        if not conversation:
            raise ChatTemplateError("cannot apply a chat template to an empty conversation")
        variables = {k: v for k, v in self.special_tokens.items() if v is not None}
        variables.update(kwargs)
        text = render_chat(
            template,
            source,
            list(conversation),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            **variables,
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

    # ---- special tokens --------------------------------------------------------------------------------

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    bos_token = property(lambda self: self.special_tokens["bos_token"])
    eos_token = property(lambda self: self.special_tokens["eos_token"])
    unk_token = property(lambda self: self.special_tokens["unk_token"])
    pad_token = property(lambda self: self.special_tokens["pad_token"])
    bos_token_id = property(lambda self: self.token_to_id(self.bos_token))
    eos_token_id = property(lambda self: self.token_to_id(self.eos_token))
    unk_token_id = property(lambda self: self.token_to_id(self.unk_token))
    pad_token_id = property(lambda self: self.token_to_id(self.pad_token))

    @property
    def eos_token_ids(self) -> list[int]:
        """Ids that end generation by the tokenizer's own account (the model config may add more)."""
        return [] if self.eos_token_id is None else [self.eos_token_id]

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of the special added tokens (chat_turns: which sampled ids end a turn)."""
        return sorted(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, source={self.source!r})"


def _token_content(value) -> str | None:
    """tokenizer_config.json writes a special token as a string or as a serialised AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return data


def _write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")
