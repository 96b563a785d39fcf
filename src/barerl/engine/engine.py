"""The engine's step loop: requests in, one step at a time, tokens and text out.

One step reads: `scheduler.schedule()` -> `runner.launch()` (forward_paged + sample) -> `scheduler.update()`
(tokens appended, forks, token stops) -> detokenize (text, stop strings). With `async_scheduling` (vLLM's
name), a lookahead step's continuation is launched before the host waits for the step's tokens, so the host's
part of a step (recording tokens, stops, text, the next schedule) runs while the GPU computes the next K tokens.

Design decisions:
- The engine holds the caller's `Model` (or, with `EngineConfig.batch_invariant` set, a view of its weights
  with that kernel choice), not a copy: a trainer updates `model.params` in place and the next step generates
  with the new weights. Cached KV blocks would be stale after such an update, so `start` (a new batch of
  requests) resets the prefix cache; `add` (more requests into a running loop: a server, multi-turn episodes)
  does not, and prefix sharing works across everything added since.
- A request is validated whole before it is built (`new_request` raises ValueError naming what is wrong), so a
  bad request never leaves half a batch in the engine. Requests without `seed` get one from the engine's
  generator (seeded by `EngineConfig.seed`), so a fresh engine reproduces a run.
- Text is built token by token only where something needs it as it grows (stop strings, streaming);
  otherwise `output` decodes each finished sample once.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from barerl.engine.config import EngineConfig, block_table_positions, kv_cache_size, max_batched_tokens
from barerl.engine.detokenizer import Detokenizer
from barerl.engine.model_runner import ModelRunner
from barerl.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from barerl.engine.sampling_params import SamplingParams
from barerl.engine.scheduler import Scheduler
from barerl.engine.sequence import Request, Sequence, SequenceStatus

if TYPE_CHECKING:
    from barerl.model.model import Model


class Engine:
    def __init__(self, model: Model, tokenizer, cfg: EngineConfig, eos_token_ids: list[int]):
        if cfg.batch_invariant is not None:
            model = model.with_batch_invariant(cfg.batch_invariant)
        self.model, self.tokenizer, self.config = model, tokenizer, cfg
        self.eos_token_ids = tuple(eos_token_ids)
        self.max_model_len, num_blocks = kv_cache_size(model, cfg)
        self.table_positions = block_table_positions(cfg, self.max_model_len)
        self.scheduler = Scheduler(
            num_blocks, cfg.block_size, cfg.max_num_seqs, max_batched_tokens(cfg, self.max_model_len),
            self.max_model_len, cfg.enable_chunked_prefill, cfg.enable_prefix_caching, self.table_positions,
        )
        self.runner = self._make_runner(num_blocks)
        self._warn_if_invariant_decode_is_narrow()
        self._rng = np.random.default_rng(cfg.seed)
        self._num_requests = 0
        self.asleep = False
        self._in_flight = None  # (batch, PendingSteps) launched, its tokens not recorded yet

    def _make_runner(self, num_blocks: int) -> ModelRunner:
        cfg = self.config
        if self.model.device != "cuda" or cfg.enforce_eager:
            return ModelRunner(self.model, num_blocks, cfg.block_size)
        from barerl.engine.cuda_graph_runner import CudaGraphRunner

        return CudaGraphRunner(self.model, num_blocks, cfg.block_size, cfg.max_num_seqs, self.table_positions)

    def _warn_if_invariant_decode_is_narrow(self) -> None:
        """Batch-invariant decode attention keeps one CTA per (sequence, kv head) over all its keys (no split):
        with too few of them for the GPU, long contexts decode several times slower. Said once, at start."""
        if not self.model.batch_invariant or self.model.device != "cuda":
            return
        from barerl.ops.cuda.launch import multiprocessors

        seqs, kv_heads = self.config.max_num_seqs, self.model.cfg.num_key_value_heads
        ctas = seqs * kv_heads
        if ctas < 2 * multiprocessors():
            warnings.warn(f"batch_invariant: decode attention runs at most {seqs} sequences x {kv_heads} kv heads "
                          f"= {ctas} CTAs for {multiprocessors()} SMs, without splitting the keys: long completions "
                          "generate several times slower than with batch_invariant=False (which splits them, at a "
                          "bf16 engine/trainer mismatch of ~0.006 per token)", stacklevel=4)

    @property
    def block_manager(self):
        return self.scheduler.block_manager

    # ---------------------------------------------------------------------------------------------- requests

    def new_request(self, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
                    continues: Sequence | None = None) -> Request:
        """A validated request with its id and seed, not yet in the scheduler (ValueError / TypeError name the
        problem). `continues`: a finished sequence whose tokens the prompt extends (a conversation's next turn):
        only the ids after them are checked, and the prefix cache finds the blocks it left by their ids."""
        if continues is not None and not isinstance(continues, Sequence):
            raise TypeError(f"continues must be the Sequence of an earlier request, got {type(continues).__name__}")
        prefix = continues is not None and prompt_token_ids[: continues.num_tokens] == continues.token_ids
        self.validate(prompt_token_ids, params, checked=continues.num_tokens if prefix else 0)
        seed = params.seed if params.seed is not None else int(self._rng.integers(2**63))
        request = Request(self._num_requests, prompt, prompt_token_ids, params, seed, self.eos_token_ids)
        if prefix:
            request.sequences[0].prefix_hint = continues.released_blocks
        self._num_requests += 1
        return request

    def validate(self, ids: list[int], params: SamplingParams, checked: int = 0) -> None:
        """`checked`: leading ids known to be in the vocabulary (a sequence's own, which a prompt extends)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) > self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than max_model_len={self.max_model_len}")
        vocab_size = self.model.cfg.vocab_size
        bad = [t for t in ids[checked:] if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} is more than max_num_seqs={self.config.max_num_seqs}")
        if params.stop_strings and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        bad = [t for t in params.stop_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(f"stop token id {bad[0]} is outside the vocabulary [0, {vocab_size})")

    def start(self, requests: list[Request]) -> None:
        """A new batch: whatever ran before is dropped and the prefix cache emptied (the weights may have changed
        in place since the last batch), then the requests are added."""
        self._require_awake()
        self.drain()
        self.scheduler.abort_all()  # an abandoned stream
        self.block_manager.reset_prefix_cache()
        self.scheduler.num_preemptions = 0
        for request in requests:
            self.add(request)

    def add(self, request: Request) -> None:
        """One more request into the running loop: it is scheduled from the next step on."""
        self._require_awake()
        self.scheduler.add(request)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None

    def abort(self, request: Request) -> None:
        """Finish a request's sequences now (a client that went away), freeing their blocks; tokens of a step
        already launched for them are dropped when it is recorded."""
        for seq in request.sequences:
            if seq.status is SequenceStatus.RUNNING:
                self.scheduler.finish(seq, "abort")
            elif seq.status is SequenceStatus.WAITING:
                self.scheduler.waiting.remove(seq)

    def clear(self) -> None:
        """Nothing running, nothing in flight (a launch that failed with its step is dropped), an empty prefix
        cache."""
        try:
            self.drain()
        except Exception:  # noqa: BLE001 -- the failure was reported with its step
            self._in_flight = None
        self.scheduler.abort_all()
        self.block_manager.reset_prefix_cache()

    # ---------------------------------------------------------------------------------------------- the loop

    def step(self, incremental_text: bool = False) -> list[Sequence]:
        """One engine step; returns the sequences that got a token. `incremental_text`: build every sequence's
        text as it grows (streaming), not only where stop strings need it."""
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

    def drain(self) -> None:
        """Wait for a launched step nobody will record (its sequences were finished or abandoned)."""
        if self._in_flight is not None:
            self._in_flight[1].result()
            self._in_flight = None

    # ---------------------------------------------------------------------------------------------- outputs

    def output(self, request: Request, num_sent: dict[int, int] | None = None) -> RequestOutput:
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
            request.arrival_time, request.first_scheduled_time, request.first_token_time, request.finished_time,
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

    # ---------------------------------------------------------------------------------------------- memory

    def _require_awake(self) -> None:
        if self.asleep:
            raise RuntimeError("the engine is asleep (its KV cache is released): call llm.wake() first")

    def sleep(self) -> None:
        """Release the KV cache (and its device memory) for training; `wake` restores it."""
        self.drain()
        self.scheduler.abort_all()
        self.runner.free_kv_cache()
        self.block_manager.reset_prefix_cache()
        self.asleep = True

    def wake(self) -> None:
        self.runner.allocate_kv_cache()
        self.asleep = False
