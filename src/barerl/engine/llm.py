"""The public engine, shaped as vLLM's `LLM`: generate, chat, stream, sleep / wake.

The whole path of one step reads: `schedule()` -> `runner.launch()` (forward_paged + sample) ->
`scheduler.update()` (tokens appended, forks, token stops) -> detokenize (text, stop strings). With
`async_scheduling` (vLLM's name), a lookahead step's continuation is launched before the host waits for the
step's tokens, so the host's part of a step (recording tokens, stops, text, the next schedule) runs while the
GPU computes the next K tokens.

Design decisions:
- The engine holds the caller's `Model`, not a copy: the trainer updates `model.params` in place and the
  next call generates with the new weights. Because cached KV blocks would be stale after such an update,
  the prefix cache is reset at the start of every `generate` / `chat` / `stream` call; prefix sharing works
  within a call (shared system prompts, the n samples of a prompt, preempted sequences coming back).
- Bad input raises ValueError before anything runs, naming the request index ("request 3: ..."), like
  vLLM: one bad prompt never leaves half a batch in the engine, and the same call without it runs as if the
  bad one had never been there (request seeds are drawn only after the whole batch validated).
- Requests without `seed` get one from the engine's generator (seeded by `seed`), so a fresh engine
  reproduces a run; with `seed`, a request's samples do not depend on anything else in the batch.
- `stream` yields delta outputs (vLLM's RequestOutputKind.DELTA): each CompletionOutput carries only the
  tokens and text that are new since the previous yield.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from barerl.cpu_threads import cpu_blas_threads
from barerl.engine.block_manager import BlockManager
from barerl.engine.detokenizer import Detokenizer
from barerl.engine.model_runner import ModelRunner
from barerl.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from barerl.engine.sampling_params import SamplingParams
from barerl.engine.scheduler import Scheduler
from barerl.engine.sequence import Request, Sequence

if TYPE_CHECKING:
    from barerl.model.model import Model

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class EngineConfig:
    device: str = "cpu"
    dtype: str = "float32"
    gpu_memory_utilization: float = 0.9  # share of GPU memory to fill; the KV cache takes what is left
    cpu_kv_cache_gib: float = 1.0  # KV cache budget on the CPU
    max_num_seqs: int = 256
    max_model_len: int | None = None  # prompt + output tokens; default: the model's, capped by the cache
    max_num_batched_tokens: int | None = None  # tokens per step; default 8192 (>= max_model_len unchunked)
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    num_kv_blocks: int | None = None  # default: as many as the memory budget holds
    enforce_eager: bool = False  # on the GPU: no CUDA graphs for decode steps
    num_scheduler_steps: int = 8  # decode steps per schedule and runner call when all can take them (lookahead)
    async_scheduling: bool = True  # start a lookahead step's continuation before recording its tokens
    batch_invariant: bool = False  # the model's batch-invariant kernels (Model.set_batch_invariant), set here
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("max_num_seqs", "block_size", "max_model_len", "max_num_batched_tokens", "num_kv_blocks",
                    "num_scheduler_steps")
        for name in positive:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"LLM: {name} must be a positive integer, got {value!r}")
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "enforce_eager", "async_scheduling",
                     "batch_invariant"):
            if not isinstance(getattr(self, name), bool):  # a string "false" would be true (ValueError: as all)
                got = getattr(self, name)
                raise ValueError(f"LLM: {name} must be True or False, got {got!r}")  # noqa: TRY004
        if not 0 < self.gpu_memory_utilization <= 1:
            got = self.gpu_memory_utilization
            raise ValueError(f"LLM: gpu_memory_utilization must be in (0, 1], got {got!r}")
        if not self.cpu_kv_cache_gib > 0:
            raise ValueError(f"LLM: cpu_kv_cache_gib must be > 0, got {self.cpu_kv_cache_gib}")


class LLM:
    def __init__(self, model: Model | str | os.PathLike, tokenizer=None, **engine_args):
        """model: a loaded `Model` (its device and dtype win over the arguments), or the path of a Hugging
        Face folder or .gguf file (loaded with `device`, `dtype`; its tokenizer too, if it has one).
        engine_args: the fields of `EngineConfig`."""
        self.config = cfg = EngineConfig(**engine_args)
        path = None
        if isinstance(model, (str, os.PathLike)):
            from barerl.model.model import Model

            path = os.fspath(model)
            model = Model.from_pretrained(path, device=cfg.device, dtype=cfg.dtype)
            from barerl.tokenizer import load_tokenizer

            tokenizer = tokenizer or load_tokenizer(path)
        self.model, self.tokenizer = model, tokenizer
        model.set_batch_invariant(cfg.batch_invariant)  # before any CUDA graph captures the kernels
        self.vocab_size = model.cfg.vocab_size
        self.eos_token_ids = _eos_token_ids(model, tokenizer, path)
        self.max_model_len, num_blocks = self._size_kv_cache()
        self.max_num_batched_tokens = self._resolve_max_num_batched_tokens()
        self.block_manager = BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager, cfg.max_num_seqs, self.max_num_batched_tokens, self.max_model_len,
            cfg.enable_chunked_prefill,
        )
        self.runner = self._make_runner(num_blocks)
        self._warn_if_invariant_decode_is_narrow()
        self._rng = np.random.default_rng(cfg.seed)
        self._num_requests = 0
        self.asleep = False
        self.stats: dict[str, float] = {}  # of the last generate/chat call
        self._in_flight = None  # (batch, PendingSteps) launched, its tokens not recorded yet

    def _make_runner(self, num_blocks: int) -> ModelRunner:
        cfg = self.config
        if self.model.device != "cuda" or cfg.enforce_eager:
            return ModelRunner(self.model, num_blocks, cfg.block_size)
        from barerl.engine.cuda_graph_runner import CudaGraphRunner

        return CudaGraphRunner(self.model, num_blocks, cfg.block_size, cfg.max_num_seqs, self.max_model_len)

    def _warn_if_invariant_decode_is_narrow(self) -> None:
        """Batch-invariant decode attention keeps one CTA per (sequence, kv head) over all its keys (no split):
        with too few of them for the GPU, long contexts decode several times slower. Said once, at start."""
        if not self.config.batch_invariant or self.model.device != "cuda":
            return
        from barerl.kernels.launch import multiprocessors

        ctas = self.config.max_num_seqs * self.model.cfg.num_key_value_heads
        if ctas < 2 * multiprocessors():
            warnings.warn(f"batch_invariant: decode attention runs at most {self.config.max_num_seqs} sequences x "
                          f"{self.model.cfg.num_key_value_heads} kv heads = {ctas} CTAs for {multiprocessors()} "
                          "SMs, without splitting the keys: long completions generate several times slower than "
                          "with batch_invariant=False (which splits them, at a bf16 engine/trainer mismatch of "
                          "~0.006 per token)", stacklevel=3)

    def get_tokenizer(self):
        return self.tokenizer

    # ------------------------------------------------------------------------------------- KV cache size

    def _size_kv_cache(self) -> tuple[int, int]:
        cfg, bs = self.config, self.config.block_size
        positions = self.model.cfg.max_position_embeddings
        if cfg.max_model_len is not None and cfg.max_model_len > positions:  # as vLLM: those were never trained
            raise ValueError(f"LLM: max_model_len={cfg.max_model_len} is more than the model's {positions} positions "
                             "(max_position_embeddings)")
        max_model_len = cfg.max_model_len or positions
        if cfg.num_kv_blocks is not None:
            num_blocks = cfg.num_kv_blocks
        else:
            num_blocks = kv_blocks_in_budget(self.model, cfg)
            if cfg.max_model_len is None:  # the model's own limit, as far as the cache can hold it
                max_model_len = min(max_model_len, num_blocks * bs)
            num_blocks = min(num_blocks, cfg.max_num_seqs * -(-max_model_len // bs))  # never more than usable
        if num_blocks * bs < max_model_len:
            raise ValueError(
                f"LLM: the KV cache holds {num_blocks} blocks x {bs} tokens, fewer than max_model_len="
                f"{max_model_len}: lower max_model_len or give the cache more memory"
            )
        return max_model_len, num_blocks

    def _resolve_max_num_batched_tokens(self) -> int:
        cfg = self.config
        if cfg.max_num_batched_tokens is None:
            n = DEFAULT_MAX_NUM_BATCHED_TOKENS
            return n if cfg.enable_chunked_prefill else max(n, self.max_model_len)
        if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"LLM: max_num_batched_tokens={cfg.max_num_batched_tokens} < "
                f"max_model_len={self.max_model_len} needs enable_chunked_prefill=True (a long prompt "
                "could never be scheduled)"
            )
        return cfg.max_num_batched_tokens

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
                self._validate_request(ids, p)
            except (ValueError, TypeError) as e:
                raise type(e)(f"request {i}: {e}") from None
            checked.append((text, ids, p))
        requests = []
        for text, ids, p in checked:
            seed = p.seed if p.seed is not None else int(self._rng.integers(2**63))
            requests.append(Request(self._num_requests, text, ids, p, seed, tuple(self.eos_token_ids)))
            self._num_requests += 1
        return requests

    def _tokenize(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer (pass tokenizer= or token ids)")
        return self.tokenizer.encode(text)

    def _validate_request(self, ids: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) > self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than max_model_len="
                             f"{self.max_model_len}")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} is more than max_num_seqs={self.config.max_num_seqs}")
        if params.stop_strings and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        bad = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad:
            raise ValueError(f"stop token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")

    # ------------------------------------------------------------------------------------------ generate

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True,
                 on_finished: Callable[[int, RequestOutput], None] | None = None) -> list[RequestOutput]:
        """prompts: a str, a list of str, a list of token ids, a list of token-id lists, or dicts with
        "prompt_token_ids" (and optionally "prompt"); sampling_params: one for all, or one per prompt.
        on_finished(i, output) is called as soon as prompt i's samples are all done, while the others still
        generate (GRPO starts scoring them there)."""
        from tqdm import tqdm

        requests = self._make_requests(prompts, sampling_params)
        self._start_call(requests)
        index_of = {r.request_id: i for i, r in enumerate(requests)}
        start, num_generated = time.perf_counter(), 0
        outputs: dict[int, RequestOutput] = {}  # by index, each built once (detokenizing is the costly part)
        with tqdm(total=len(requests), desc="generate", unit="req", disable=not use_tqdm) as bar, self._threads():
            while self.scheduler.has_unfinished() or self._in_flight is not None:
                sampled = self._step()
                num_generated += len(sampled)
                finished = sorted({index_of[s.request.request_id] for s in sampled if s.request.finished}
                                  - outputs.keys())
                for i in finished:
                    outputs[i] = self._output(requests[i])
                    if on_finished is not None:
                        on_finished(i, outputs[i])
                bar.update(len(finished))
                bar.set_postfix(tok_s=f"{num_generated / (time.perf_counter() - start):.1f}", refresh=False)
        self.stats = {
            "num_requests": len(requests),
            "num_prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
            "num_generated_tokens": num_generated, "elapsed_s": time.perf_counter() - start,
            "num_preemptions": self.scheduler.num_preemptions,
        }
        self.stats["tokens_per_s"] = num_generated / max(self.stats["elapsed_s"], 1e-9)
        return [outputs[i] if i in outputs else self._output(r) for i, r in enumerate(requests)]

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
        self._start_call([request])
        num_sent: dict[int, int] = {}
        while not request.finished:
            with self._threads():
                sampled = self._step(incremental_text=True)
            if sampled:
                yield self._output(request, num_sent)
        self._drain()

    def _threads(self):
        """On the CPU, the BLAS on a core fewer than there are: on all of them, each product waits for a time
        slice whenever another thread holds a core (cpu_threads.py)."""
        return cpu_blas_threads() if self.model.device == "cpu" else nullcontext()

    def _start_call(self, requests: list[Request]) -> None:
        if self.asleep:
            raise RuntimeError("the engine is asleep (its KV cache is released): call llm.wake() first")
        self._drain()
        self.scheduler.abort_all()  # an abandoned stream
        self.block_manager.reset_prefix_cache()  # the weights may have changed in place since the last call
        self.scheduler.num_preemptions = 0
        for request in requests:
            self.scheduler.add(request)

    def _step(self, incremental_text: bool = False) -> list[Sequence]:
        """One engine step. Text is built token by token only where needed (stop strings, streaming);
        otherwise `_text` decodes each finished sample once."""
        if self._in_flight is None:
            batch = self.scheduler.schedule(self.config.num_scheduler_steps)
            pending = self.runner.launch(batch)
        else:
            (batch, pending), self._in_flight = self._in_flight, None
        following = self.scheduler.schedule_continuation(batch) if self.config.async_scheduling else None
        if following is not None:
            self._in_flight = following, self.runner.continue_steps(following, pending)
        tokens, logprobs = pending.result()
        if np.isnan(logprobs).any():  # NaN logits, from NaN weights: sampling would go on with token 0
            raise ValueError("the model's logits are NaN: its weights hold NaN or inf (a damaged checkpoint, or "
                             "training that diverged); nothing it generates is meaningful")
        sampled = []
        for k, (step, rows) in enumerate(self.scheduler.step_batches(batch)):
            step_tokens, step_logprobs = (tokens, logprobs) if rows is None else (tokens[k, rows], logprobs[k, rows])
            for seq in self.scheduler.update(step, step_tokens, step_logprobs):
                if self.tokenizer is not None and (incremental_text or seq.params.stop_strings):
                    self._detokenize(seq)
                sampled.append(seq)
        return sampled

    def _detokenize(self, seq: Sequence) -> None:
        if seq.detokenizer is None:
            seq.detokenizer = Detokenizer(self.tokenizer, seq.params)
        stop_terminated = seq.finish_reason == "stop"
        stop = seq.detokenizer.update(seq.token_ids[-1], seq.is_finished, stop_terminated)
        if stop is None:
            return
        if seq.is_finished:  # the same token also hit the length limit: the stop string wins (vLLM)
            seq.finish_reason, seq.stop_reason = "stop", stop
        else:
            self.scheduler.finish(seq, "stop", stop)

    def _output(self, request: Request, num_sent: dict[int, int] | None = None) -> RequestOutput:
        """Cumulative output, or with num_sent (seq_id -> tokens already yielded) the delta since then."""
        outputs = []
        for seq in sorted(request.sequences, key=lambda s: s.sample_index):
            first = 0 if num_sent is None else num_sent.get(seq.seq_id, 0)
            token_ids, logprobs = seq.output_token_ids[first:], seq.output_logprobs[first:]
            if num_sent is not None:
                num_sent[seq.seq_id] = seq.num_output_tokens
            detok = seq.detokenizer
            text = self._text(seq) if num_sent is None else detok.next_text(seq.is_finished) if detok else ""
            outputs.append(CompletionOutput(
                index=seq.sample_index, text=text, token_ids=token_ids,
                cumulative_logprob=float(sum(seq.output_logprobs)),
                logprobs=logprobs if seq.params.wants_logprobs else None,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
            ))
        metrics = RequestMetrics(
            request.arrival_time, request.first_scheduled_time, request.first_token_time,
            request.finished_time,
            len(request.prompt_token_ids), request.num_cached_tokens,
            sum(s.num_output_tokens for s in request.sequences),
        )
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, outputs,
                             request.finished, metrics)

    def _text(self, seq: Sequence) -> str:
        """The sample's whole text: its detokenizer's, or one decode of its tokens (less a stop token's)."""
        if seq.detokenizer is not None:
            return seq.detokenizer.text
        if self.tokenizer is None:
            return ""
        ids = seq.output_token_ids
        stop_token = seq.finish_reason == "stop" and not isinstance(seq.stop_reason, str)
        if stop_token and not seq.params.include_stop_str_in_output:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=seq.params.skip_special_tokens)

    # ------------------------------------------------------------------------------------- sleep / wake

    def _drain(self) -> None:
        """Wait for a launched step nobody will record (its sequences were finished or abandoned)."""
        if self._in_flight is not None:
            self._in_flight[1].result()
            self._in_flight = None

    def sleep(self) -> None:
        """Release the KV cache (and its device memory) for training; `wake` restores it."""
        self._drain()
        self.scheduler.abort_all()
        self.runner.free_kv_cache()
        self.block_manager.reset_prefix_cache()
        self.asleep = True

    def wake(self) -> None:
        self.runner.allocate_kv_cache()
        self.asleep = False

    def reset_prefix_cache(self) -> None:
        self.block_manager.reset_prefix_cache()

    def device_memory_bytes(self) -> int:
        """Device memory held now by everything on CuPy's default pool (weights, optimizer state, activations
        and the pool's cached free blocks) plus what the engine holds outside it; 0 on the CPU."""
        pool = getattr(self.model.xp, "get_default_memory_pool", None)
        return 0 if pool is None else pool().total_bytes() + self.runner.bytes_outside_default_pool()


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


def kv_blocks_in_budget(model: Model, cfg: EngineConfig) -> int:
    """KV blocks the memory budget holds: gpu_memory_utilization of the GPU less what is in use, or
    cpu_kv_cache_gib on the CPU."""
    if model.device == "cuda":
        budget = _gpu_kv_budget(cfg.gpu_memory_utilization)
    else:
        budget = int(cfg.cpu_kv_cache_gib * 2**30)
    return budget // (model.kv_cache_bytes_per_token() * cfg.block_size)


def _gpu_kv_budget(utilization: float) -> int:
    """Bytes the KV cache may take: utilization x total GPU memory, less what is in use."""
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    in_use = total - free - cupy.get_default_memory_pool().free_bytes()
    return max(0, int(total * utilization) - in_use)
