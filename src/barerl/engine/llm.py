"""The public engine, shaped as vLLM's `LLM`: generate, chat, stream, sleep / wake. Only the API lives here:
prompts in their several forms become requests, `engine.Engine` runs them step by step.

- Bad input raises ValueError before anything runs, naming the request index ("request 3: ..."), like vLLM:
  one bad prompt never leaves half a batch in the engine, and the same call without it runs as if the bad one
  had never been there (request seeds are drawn only after the whole batch validated).
- Each `generate` / `chat` / `stream` call is a new batch: the prefix cache starts empty (the weights may have
  been updated in place since the last call), and prefix sharing works within the call (shared system
  prompts, the n samples of a prompt, preempted sequences coming back).
- `stream` yields delta outputs (vLLM's RequestOutputKind.DELTA): each CompletionOutput carries only the tokens
  and text that are new since the previous yield.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import TYPE_CHECKING

import numpy as np

from barerl.cpu_threads import cpu_blas_threads
from barerl.engine.config import EngineConfig
from barerl.engine.engine import Engine
from barerl.engine.outputs import RequestOutput
from barerl.engine.sampling_params import SamplingParams
from barerl.engine.sequence import Request

if TYPE_CHECKING:
    from barerl.model.model import Model


class LLM:
    def __init__(self, model: Model | str | os.PathLike, tokenizer=None, **engine_args):
        """model: a loaded `Model` (its device and dtype win over the arguments), or the path of a Hugging
        Face folder or .gguf file (loaded with `device`, `dtype`; its tokenizer too, if it has one).
        engine_args: the fields of `EngineConfig`."""
        cfg = EngineConfig(**engine_args)
        path = None
        if isinstance(model, (str, os.PathLike)):
            from barerl.model.model import Model
            from barerl.tokenizer import load_tokenizer

            path = os.fspath(model)
            model = Model.from_pretrained(path, device=cfg.device, dtype=cfg.dtype)
            tokenizer = tokenizer or load_tokenizer(path)
        self.tokenizer = tokenizer
        self.engine = Engine(model, tokenizer, cfg, _eos_token_ids(model, tokenizer, path))
        self.stats: dict[str, float] = {}  # of the last generate/chat call

    @property
    def model(self) -> Model:
        return self.engine.model

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    def get_tokenizer(self):
        return self.tokenizer

    # ---------------------------------------------------------------------------------------------- input

    def _make_requests(self, prompts, sampling_params) -> list[Request]:
        """Validate the whole batch first, then build its requests (ValueError names the bad request)."""
        items = _normalize_prompts(prompts)
        params = sampling_params if sampling_params is not None else SamplingParams()
        params_list = params if isinstance(params, (list, tuple)) else [params] * len(items)
        if len(params_list) != len(items):
            raise ValueError(f"got {len(items)} prompts but {len(params_list)} sampling params")
        checked = []
        for i, ((text, ids), p) in enumerate(zip(items, params_list)):
            try:
                ids = self._tokenize(text) if ids is None else ids
                self.engine.validate(ids, p)
            except (ValueError, TypeError) as e:
                raise type(e)(f"request {i}: {e}") from None
            checked.append((text, ids, p))
        return [self.engine.new_request(text, ids, p) for text, ids, p in checked]

    def _tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer (pass tokenizer= or token ids)")
        return self.tokenizer.encode(text)

    # ------------------------------------------------------------------------------------------ generate

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True,
                 on_finished: Callable[[int, RequestOutput], None] | None = None) -> list[RequestOutput]:
        """prompts: a str, a list of str, a list of token ids, a list of token-id lists, or dicts with
        "prompt_token_ids" (and optionally "prompt"); sampling_params: one for all, or one per prompt.
        on_finished(i, output) is called as soon as prompt i's samples are all done, while the others still
        generate (GRPO starts scoring them there)."""
        from tqdm import tqdm

        engine = self.engine
        requests = self._make_requests(prompts, sampling_params)
        engine.start(requests)
        index_of = {r.request_id: i for i, r in enumerate(requests)}
        start, num_generated = time.perf_counter(), 0
        outputs: dict[int, RequestOutput] = {}  # by index, each built once (detokenizing is the costly part)
        with tqdm(total=len(requests), desc="generate", unit="req", disable=not use_tqdm) as bar, self._threads():
            while engine.has_unfinished():
                sampled = engine.step()
                num_generated += len(sampled)
                finished = sorted({index_of[s.request.request_id] for s in sampled if s.request.finished}
                                  - outputs.keys())
                for i in finished:
                    outputs[i] = engine.output(requests[i])
                    if on_finished is not None:
                        on_finished(i, outputs[i])
                bar.update(len(finished))
                bar.set_postfix(tok_s=f"{num_generated / (time.perf_counter() - start):.1f}", refresh=False)
        self.stats = {
            "num_requests": len(requests),
            "num_prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
            "num_generated_tokens": num_generated, "elapsed_s": time.perf_counter() - start,
            "num_preemptions": engine.scheduler.num_preemptions,
        }
        self.stats["tokens_per_s"] = num_generated / max(self.stats["elapsed_s"], 1e-9)
        return [outputs[i] if i in outputs else engine.output(r) for i, r in enumerate(requests)]

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """messages: one conversation (a list of {"role", "content"} dicts) or a list of conversations."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = []
        for i, conversation in enumerate(conversations):
            try:
                text = self.tokenizer.apply_chat_template(
                    conversation, add_generation_prompt=add_generation_prompt, tokenize=False,
                    **(chat_template_kwargs or {}),
                )
            except ValueError as e:
                raise ValueError(f"conversation {i}: {e}") from None
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm)

    def stream(self, prompt, sampling_params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Generate for one prompt, yielding delta outputs after every step that gave it tokens."""
        [request] = self._make_requests([prompt], sampling_params)
        self.engine.start([request])
        num_sent: dict[int, int] = {}
        while not request.finished:
            with self._threads():
                sampled = self.engine.step(incremental_text=True)
            if sampled:
                yield self.engine.output(request, num_sent)
        self.engine.drain()

    def _threads(self):
        """On the CPU, the BLAS on a core fewer than there are: on all of them, each product waits for a time
        slice whenever another thread holds a core (cpu_threads.py)."""
        return cpu_blas_threads() if self.model.device == "cpu" else nullcontext()

    # ------------------------------------------------------------------------------------- sleep / wake

    def sleep(self) -> None:
        """Release the KV cache (and its device memory) for training; `wake` restores it."""
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()

    @property
    def asleep(self) -> bool:
        return self.engine.asleep

    def reset_prefix_cache(self) -> None:
        self.engine.block_manager.reset_prefix_cache()


# ------------------------------------------------------------------------------------------------ helpers


def _normalize_prompts(prompts) -> list[tuple[str | None, list[int] | None]]:
    """Each prompt as (text, token ids), either of which may be None (ids then come from the text)."""
    if isinstance(prompts, (str, dict)) or _is_token_list(prompts):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list, got {type(prompts).__name__}")
    items = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            items.append((p, None))
        elif _is_token_list(p):
            items.append((None, [int(t) for t in p]))
        elif isinstance(p, dict) and ("prompt_token_ids" in p or "prompt" in p):
            ids = p.get("prompt_token_ids")
            if ids is not None and not _is_token_list(ids):
                raise ValueError(f"request {i}: prompt_token_ids must be a list of ints")
            items.append((p.get("prompt"), None if ids is None else [int(t) for t in ids]))
        else:
            raise ValueError(f"request {i}: a prompt is a str, a list of token ids or a dict with "
                             f"'prompt_token_ids', got {type(p).__name__}")
    return items


def _is_token_list(x) -> bool:
    if isinstance(x, np.ndarray):
        return x.ndim == 1 and np.issubdtype(x.dtype, np.integer)
    return isinstance(x, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in x) and (
        not any(isinstance(t, bool) for t in x)
    )


def _eos_token_ids(model, tokenizer, path: str | None) -> list[int]:
    """EOS ids of the tokenizer, config.json and generation_config.json, within the model's vocabulary."""
    ids = set(model.cfg.eos_token_ids)
    if tokenizer is not None:
        ids |= set(tokenizer.eos_token_ids)
    gen_config = os.path.join(path, "generation_config.json") if path and os.path.isdir(path) else None
    if gen_config and os.path.isfile(gen_config):
        with open(gen_config, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token_id")
        ids |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return sorted(i for i in ids if 0 <= i < model.cfg.vocab_size)
