"""Model runner: turns a scheduled batch into arrays, runs the model on the paged KV cache, samples.

`prepare_step` builds every array of a step on the host, as int32/fp32/uint64/int64 NumPy arrays (shapes
below); `ModelRunner.execute` hands them to the device: block copies (copy-on-write), then
`model.forward_paged` (last-token logits of every scheduled sequence), then `backend.sample` on the rows
that sample. A CUDA-graph runner replaces `execute` for decode-only steps (`StepInputs.is_decode_only`)
and keeps everything else. The runner owns the KV cache: `free_kv_cache` / `allocate_kv_cache` are the
engine's sleep and wake.

Several decode steps in one call (`ScheduledBatch.num_steps` > 1, see the scheduler's lookahead): the
first step's inputs are prepared as usual, the block tables already hold the blocks of every step, and
`backend.advance_decode` turns each step's sampled tokens into the next step's inputs on the device, so the
host sees the K x R tokens once, at the end.

Asynchronous calls: `launch` starts a step and returns a `PendingSteps` whose `result()` waits for its
tokens. A lookahead call still on its way can be followed by `continue_steps` (the scheduler's
`schedule_continuation`: the same sequences, K more steps): its inputs are the previous call's advanced
once more on the device, so the GPU starts it before the host has seen the previous tokens, and the
host's bookkeeping of one call runs while the GPU computes the next.

Sampling rows: a sequence whose computed prefix reaches the end of its tokens this step draws its next
token from its logits row; a parent (n samples, before its first token) draws n tokens from the same row
with n seeds, which is how the n samples of one prompt share one prefill. Rows of sequences in the middle
of a prefill chunk are computed and ignored. counter = index of the token being drawn in its sequence.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from barerl.engine.scheduler import ScheduledBatch


@dataclass
class StepInputs:
    # model.forward_paged: T new tokens of S sequences, packed
    input_ids: np.ndarray  # (T,) int32
    positions: np.ndarray  # (T,) int32, position of each token in its sequence
    cu_seqlens_q: np.ndarray  # (S+1,) int32, new-token boundaries
    context_lens: np.ndarray  # (S,) int32, tokens in the cache once this step's are written
    block_tables: np.ndarray  # (S, max_blocks) int32, -1 past each sequence's last block
    slot_mapping: np.ndarray  # (T,) int32, flat cache slot (block * block_size + offset) of each new token
    fresh_from: int  # sequences fresh_from.. (the newly admitted, last in a batch) have no cached tokens yet
    # copy-on-write, done before the forward pass: block copy_dst[i] := block copy_src[i], all layers, K and V
    copy_src: np.ndarray  # (C,) int32
    copy_dst: np.ndarray  # (C,) int32
    # backend.sample over R rows
    sample_rows: np.ndarray  # (R,) int32, the logits row (sequence index) each sample draws from
    temperature: np.ndarray  # (R,) fp32, 0 = greedy
    top_k: np.ndarray  # (R,) int32, 0 = off
    top_p: np.ndarray  # (R,) fp32, 1 = off
    min_p: np.ndarray  # (R,) fp32, 0 = off
    seeds: np.ndarray  # (R,) uint64
    counters: np.ndarray  # (R,) int64
    banned_rows: np.ndarray  # (M,) int32: logits[sample banned_rows[i], banned_tokens[i]] = -inf (min_tokens)
    banned_tokens: np.ndarray  # (M,) int32

    @property
    def is_decode_only(self) -> bool:
        """One new token per sequence and one sample per sequence: the step a CUDA graph replays."""
        return len(self.input_ids) == len(self.context_lens) == len(self.sample_rows)


# The inputs a decode step changes for the next one (backend.advance_decode's arguments, in its order).
_ADVANCED_FIELDS = ("input_ids", "positions", "context_lens", "slot_mapping", "counters", "block_tables")


def _i32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def block_tables(batch: ScheduledBatch) -> np.ndarray:
    """(S, max_blocks) int32: each sequence's block table, -1 past its last block."""
    max_blocks = max(len(seq.block_table) for seq in batch.seqs)
    return _i32([seq.block_table + [-1] * (max_blocks - len(seq.block_table)) for seq in batch.seqs])


def block_copies(batch: ScheduledBatch) -> tuple[np.ndarray, np.ndarray]:
    """The copy-on-write pairs as (src, dst) int32 arrays."""
    copies = np.asarray(batch.block_copies, dtype=np.int32).reshape(-1, 2)
    return copies[:, 0].copy(), copies[:, 1].copy()


def prepare_step(batch: ScheduledBatch, block_size: int) -> StepInputs:
    """The host arrays of one step (see StepInputs). Plain Python lists, one conversion per array: with
    hundreds of decoding sequences, per-sequence NumPy calls would cost more than the lists."""
    ids, positions, slots, cu, context_lens = [], [], [], [0], []
    for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
        start, end, table = seq.num_computed_tokens, seq.num_computed_tokens + num_new, seq.block_table
        ids += seq.token_ids[start:end]
        positions += range(start, end)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        cu.append(end - start + cu[-1])
        context_lens.append(end)
    copy_src, copy_dst = block_copies(batch)
    fresh_from = len(batch.seqs)
    while fresh_from and batch.seqs[fresh_from - 1].num_computed_tokens == 0:
        fresh_from -= 1
    return StepInputs(
        input_ids=_i32(ids), positions=_i32(positions), cu_seqlens_q=_i32(cu),
        context_lens=_i32(context_lens), block_tables=block_tables(batch), slot_mapping=_i32(slots),
        fresh_from=fresh_from, copy_src=copy_src, copy_dst=copy_dst, **_sampling_arrays(batch),
    )


def _sampling_arrays(batch: ScheduledBatch) -> dict[str, np.ndarray]:
    rows, temperature, top_k, top_p, min_p, seeds, counters = ([] for _ in range(7))
    banned_rows, banned_tokens = [], []
    for i, seq in enumerate(batch.seqs):
        if not batch.samples(i):
            continue
        f = seq.params.filter
        banned = seq.banned_token_ids()
        for seed in seq.sample_seeds():
            banned_rows += [len(rows)] * len(banned)
            banned_tokens += banned
            rows.append(i)
            temperature.append(f.temperature)
            top_k.append(f.top_k)
            top_p.append(f.top_p)
            min_p.append(f.min_p)
            seeds.append(seed)
            counters.append(seq.num_output_tokens)
    return {
        "sample_rows": _i32(rows), "temperature": np.asarray(temperature, np.float32), "top_k": _i32(top_k),
        "top_p": np.asarray(top_p, np.float32), "min_p": np.asarray(min_p, np.float32),
        "seeds": np.asarray(seeds, np.uint64), "counters": np.asarray(counters, np.int64),
        "banned_rows": _i32(banned_rows), "banned_tokens": _i32(banned_tokens),
    }


def _to_host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


class PendingSteps:
    """A runner call on its way: `result()` waits for its tokens and log-probs (host arrays, shaped as
    `ModelRunner.run` returns them). `state` is what the runner needs to continue it (None: it cannot be)."""

    def __init__(self, fetch, state=None):
        self._fetch, self.state, self._result = fetch, state, None

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if self._result is None:
            self._result = self._fetch()
        return self._result


def _done(tokens: np.ndarray, logprobs: np.ndarray) -> PendingSteps:
    return PendingSteps(lambda: (tokens, logprobs))


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int):
        self.model = model
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.kv_cache = None  # (2, L, num_blocks, block_size, K, D)
        self.allocate_kv_cache()

    def allocate_kv_cache(self) -> None:
        if self.kv_cache is None:
            self.kv_cache = self.model.allocate_kv_cache(self.num_blocks, self.block_size)

    def bytes_outside_default_pool(self) -> int:
        return 0

    def free_kv_cache(self) -> None:
        self.kv_cache = None
        self.release_cached_blocks()

    def release_cached_blocks(self) -> None:
        """CuPy keeps freed blocks in its pool (a training step's activations, say): hand them back to the
        device, so that the cache (mapped outside the pool, or allocated from it) takes their place."""
        free_pool = getattr(self.model.xp, "get_default_memory_pool", None)
        if free_pool is not None:
            free_pool().free_all_blocks()

    def run(self, batch: ScheduledBatch) -> tuple[np.ndarray, np.ndarray]:
        """Sampled tokens (R,) int32 and their log-probs (R,) fp32 on the host; (num_steps, R) when the batch
        runs several decode steps."""
        return self.launch(batch).result()

    def launch(self, batch: ScheduledBatch) -> PendingSteps:
        """Start `run(batch)`; the result is the PendingSteps'."""
        inputs = prepare_step(batch, self.block_size)
        if batch.num_steps == 1:
            return _done(*self.execute(inputs))
        return self.execute_steps(inputs, batch.num_steps)

    def execute_steps(self, inputs: StepInputs, num_steps: int) -> PendingSteps:
        """num_steps decode steps of a decode-only batch, inputs advanced on the device between steps."""
        if self.kv_cache is None:
            raise RuntimeError("the KV cache is released (the engine is asleep): call wake() first")
        xp = self.model.xp
        arrays = {name: xp.array(getattr(inputs, name)) for name in (*_ADVANCED_FIELDS, "cu_seqlens_q")}
        self.copy_blocks(inputs.copy_src, inputs.copy_dst)
        return self._decode_pending(inputs, arrays, num_steps)

    def continue_steps(self, batch: ScheduledBatch, previous: PendingSteps) -> PendingSteps:
        """`batch` (from `Scheduler.schedule_continuation`) right after `previous`, a lookahead call of the
        same rows that may still be running: the device advances previous's last inputs by its last tokens,
        with `batch`'s block tables (which hold the new steps' blocks), and runs batch.num_steps more steps."""
        inputs, arrays, last_tokens = previous.state
        arrays["block_tables"] = self.model.xp.asarray(block_tables(batch))
        self.copy_blocks(*block_copies(batch))
        self.advance(last_tokens, arrays)
        return self._decode_pending(inputs, arrays, batch.num_steps)

    def advance(self, tokens, arrays: dict) -> None:
        """A decode step's inputs in `arrays` (device, changed in place) become the next step's, given its
        sampled tokens."""
        self.model.ops.advance_decode(tokens, *(arrays[name] for name in _ADVANCED_FIELDS), self.block_size)

    def _decode_pending(self, inputs: StepInputs, arrays: dict, num_steps: int) -> PendingSteps:
        tokens, logprobs = self.decode_steps(
            arrays, num_steps, lambda logits, counters: self._sample_rows(logits, inputs, counters))
        return PendingSteps(lambda: (_to_host(tokens), _to_host(logprobs)), (inputs, arrays, tokens[-1]))

    def decode_steps(self, arrays: dict, num_steps: int, sample, max_position: int | None = None):
        """forward_paged + sample(logits, counters), num_steps times, on device `arrays` (the forward_paged
        inputs and counters, changed in place: backend.advance_decode feeds each step's tokens to the next).
        Returns tokens and log-probs (num_steps, S) on the device."""
        tokens = logprobs = None
        for step in range(num_steps):
            if step:
                self.advance(tokens[step - 1], arrays)
            logits = self.model.forward_paged(
                arrays["input_ids"], arrays["positions"], arrays["cu_seqlens_q"], arrays["context_lens"],
                arrays["block_tables"], arrays["slot_mapping"], self.kv_cache, max_position=max_position,
            )
            step_tokens, step_logprobs = sample(logits, arrays["counters"])
            if num_steps == 1:  # a view: no copy kernel in a one-step graph
                return step_tokens[None], step_logprobs[None]
            if tokens is None:  # rows written in place: stacking many arrays copies a pointer table from the
                # host, which CUDA-graph capture forbids
                tokens = self.model.xp.empty((num_steps, *step_tokens.shape), step_tokens.dtype)
                logprobs = self.model.xp.empty((num_steps, *step_logprobs.shape), step_logprobs.dtype)
            tokens[step], logprobs[step] = step_tokens, step_logprobs
        return tokens, logprobs

    def execute(self, inputs: StepInputs) -> tuple[np.ndarray, np.ndarray]:
        if self.kv_cache is None:
            raise RuntimeError("the KV cache is released (the engine is asleep): call wake() first")
        self.copy_blocks(inputs.copy_src, inputs.copy_dst)
        decode = len(inputs.input_ids) == len(inputs.context_lens)  # one new token per sequence
        # a prefill or mixed step runs once: its decode-sized products are not worth a tuning stall
        with nullcontext() if decode else self.model.ops.defer_decode_tuning():
            logits = self.model.forward_paged(
                inputs.input_ids, inputs.positions, inputs.cu_seqlens_q, inputs.context_lens,
                inputs.block_tables, inputs.slot_mapping, self.kv_cache, fresh_from=inputs.fresh_from,
            )
        return self.sample(logits, inputs)

    def copy_blocks(self, src: np.ndarray, dst: np.ndarray) -> None:
        if len(src):
            xp = self.model.xp
            self.kv_cache[:, :, xp.asarray(dst)] = self.kv_cache[:, :, xp.asarray(src)]

    def sample(self, logits, inputs: StepInputs) -> tuple[np.ndarray, np.ndarray]:
        if not len(inputs.sample_rows):
            return np.empty(0, np.int32), np.empty(0, np.float32)
        tokens, logprobs = self._sample_rows(logits, inputs, self.model.xp.asarray(inputs.counters))
        return _to_host(tokens), _to_host(logprobs)

    def _sample_rows(self, logits, inputs: StepInputs, counters):
        """Device tokens and log-probs of the sampling rows (banned tokens masked first)."""
        xp = self.model.xp
        rows = logits[xp.asarray(inputs.sample_rows)]
        if len(inputs.banned_rows):
            rows[xp.asarray(inputs.banned_rows), xp.asarray(inputs.banned_tokens)] = -np.inf
        return self.model.ops.sample(
            rows, xp.asarray(inputs.temperature), xp.asarray(inputs.top_k), xp.asarray(inputs.top_p),
            xp.asarray(inputs.min_p), xp.asarray(inputs.seeds), counters,
        )
