"""Continuous-batching scheduler: which sequences compute which tokens this step. Pure Python.

One step has a budget of `max_num_batched_tokens` tokens and at most `max_num_seqs` sequences, and mixes
prefill chunks and decode tokens freely (the model takes both in one packed batch):
1. Running sequences first, oldest first: a decoding sequence takes one token, a sequence part-way through
   its prompt takes the next chunk that fits the budget. When the cache has no block for a sequence, the
   youngest running sequence is preempted (its blocks freed, recomputed later), repeatedly, until the block
   fits or the sequence itself was the youngest.
2. Then, if nothing was preempted, waiting requests are admitted in order while the budget, the sequence
   limit and the free blocks allow: blocks for the whole prompt are taken at once (cached prefix blocks
   reused), and the prompt is computed in chunks when it exceeds the budget (chunked prefill) or admitted
   only when it fits whole (chunked prefill off).
A parent sequence (n samples, before its first token) counts as n sequences towards `max_num_seqs`, since
it forks into n right after its prefill. Finished sequences free their blocks at once.

Lookahead (`schedule(num_steps=K)`, vLLM's multi-step scheduling): a decode-only batch with nothing waiting
gets the blocks of its next K tokens at once and runs K steps in one runner call, so the host schedules once
per K tokens. Only when every sequence has K more positions in its block table (`table_positions`: the
engine gives it 2K - 1 beyond max_model_len), some sequence may take at least half of them (max_tokens and
max_model_len: near their ends, single steps would cost a launch per token for the whole batch, while steps
past a sequence's stop only compute tokens that are dropped), none still has banned tokens (min_tokens) or
forks, and the cache has the blocks; otherwise the step is a single one. Tokens drawn after a sequence stops
are dropped by `update`, which the engine calls once per step taken.
A lookahead batch still running can be followed by its continuation (`schedule_continuation`: the same
sequences, K more steps, blocks taken now), which the runner starts before the host records the first
batch's tokens (vLLM's async scheduling). Those tokens are unknown then, so a continuation needs 2K positions
per sequence and one sequence that may take half of its K steps after the first batch's; a sequence that
stops in the first batch has its continued tokens dropped by `update` too, and the batch after that is
scheduled afresh.

Stop conditions checked here are those on token ids (vLLM's order: length first, then EOS, then
`stop_token_ids`); stop strings need text and are checked by the engine, which calls `finish`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from barerl.engine.block_manager import BlockManager
from barerl.engine.sequence import Request, Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """One step's work: seqs[i] computes its next num_new_tokens[i] tokens; block copies come first."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) copy-on-write pairs
    num_steps: int = 1  # decode steps run in one go (lookahead)

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def samples(self, i: int) -> bool:
        """Whether seqs[i] reaches the end of its tokens this step, so its logits give its next token."""
        return self.seqs[i].num_computed_tokens + self.num_new_tokens[i] == self.seqs[i].num_tokens

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.num_new_tokens)


class Scheduler:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = True,
        table_positions: int | None = None,
    ):
        """table_positions: positions a block table may hold (default max_model_len): lookahead steps past a
        sequence's last token write there."""
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)  # the KV cache's blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.table_positions = table_positions or max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # oldest first
        self.num_preemptions = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request.sequences[0])

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort_all(self) -> None:
        """Drop every unfinished sequence (an abandoned stream) and free its blocks."""
        for seq in self.running:
            self.block_manager.free(seq)
        self.running.clear()
        self.waiting.clear()

    # -------------------------------------------------------------------------------------------- schedule

    def schedule(self, num_steps: int = 1) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.can_append(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break
            batch.block_copies += self.block_manager.append_slots(seq, num_new)
            batch.add(seq, num_new)
            budget -= num_new
            i += 1
        if not preempted:
            self._admit_waiting(batch, budget)
        if not batch.seqs and self.has_unfinished():
            raise RuntimeError("scheduler: nothing fits in the KV cache (give it more blocks, or lower "
                               "max_model_len)")
        if num_steps > 1 and self._can_look_ahead(batch, num_steps):
            for seq in batch.seqs:
                self.block_manager.append_slots(seq, num_steps)
            batch.num_steps = num_steps
        return batch

    def _can_look_ahead(self, batch: ScheduledBatch, num_steps: int) -> bool:
        if self.waiting or not batch.is_decode_only:
            return False
        for i, seq in enumerate(batch.seqs):
            if (not batch.samples(i) or seq.num_samples != 1 or seq.banned_token_ids()
                    or self._positions_left(seq) < num_steps):
                return False
        if 2 * max(self._room(seq) for seq in batch.seqs) < num_steps:
            return False
        needed = sum(self.block_manager.num_blocks_to_append(seq, num_steps) for seq in batch.seqs)
        return needed <= self.block_manager.num_free_blocks

    def _room(self, seq: Sequence) -> int:
        """Tokens seq may still generate (max_tokens, max_model_len)."""
        max_tokens = seq.params.max_tokens or self.max_model_len
        return min(max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens)

    def _positions_left(self, seq: Sequence) -> int:
        """Positions of the cache's block table left to seq (steps past its stop still write their keys)."""
        return self.table_positions - seq.num_tokens

    def schedule_continuation(self, batch: ScheduledBatch) -> ScheduledBatch | None:
        """The lookahead batch after `batch`, whose tokens are not recorded yet: the same sequences for
        batch.num_steps more steps, with their blocks; None unless every one is still running with positions
        for them, one may take half of them (as in `schedule`), nothing waits (it would be admitted next) and
        the cache has the blocks."""
        num_steps = batch.num_steps
        if num_steps == 1 or self.waiting:
            return None
        ahead = 2 * num_steps  # batch's own steps, then the continuation's
        for seq in batch.seqs:
            if seq.status is not SequenceStatus.RUNNING or self._positions_left(seq) < ahead:
                return None
        if 2 * (max(self._room(seq) for seq in batch.seqs) - num_steps) < num_steps:
            return None
        needed = sum(self.block_manager.num_blocks_to_append(seq, ahead) for seq in batch.seqs)
        if needed > self.block_manager.num_free_blocks:
            return None
        following = ScheduledBatch(num_steps=num_steps)
        for seq in batch.seqs:
            following.block_copies += self.block_manager.append_slots(seq, ahead)
            following.add(seq, 1)
        return following

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        num_running_samples = sum(s.num_samples for s in self.running)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if num_running_samples + seq.num_samples > self.max_num_seqs:
                break
            hits = self.block_manager.lookup(seq)
            num_new = seq.num_tokens - len(hits) * self.block_manager.block_size
            if num_new > budget and not self.enable_chunked_prefill:
                break
            if not self.block_manager.can_allocate(seq, hits):
                break
            self.block_manager.allocate(seq, hits)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            num_running_samples += seq.num_samples
            num_new = min(num_new, budget)
            batch.add(seq, num_new)
            budget -= num_new
            request = seq.request
            if request.first_scheduled_time is None:
                request.first_scheduled_time = time.perf_counter()
                request.num_cached_tokens = seq.num_computed_tokens

    def _preempt(self, seq: Sequence) -> None:
        """Recompute later: free seq's blocks and put it first in the waiting queue."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # ---------------------------------------------------------------------------------------------- update

    def step_batches(self, batch: ScheduledBatch):
        """The single steps of a lookahead batch, each of the sequences still running (one per step taken),
        with the rows of the runner's output they read; a single step yields itself."""
        if batch.num_steps == 1:
            yield batch, None
            return
        for _ in range(batch.num_steps):
            rows = [i for i, seq in enumerate(batch.seqs) if seq.status is SequenceStatus.RUNNING]
            if not rows:
                return
            yield ScheduledBatch([batch.seqs[i] for i in rows], [1] * len(rows)), rows

    def update(self, batch: ScheduledBatch, tokens: list[int], logprobs: list[float]) -> list[Sequence]:
        """Record the step: advance computed prefixes, append sampled tokens (forking parents), check stops.

        tokens/logprobs hold one entry per sample drawn, in batch order (a parent draws n). Returns the
        sequences that received a token, forked children included.
        """
        sampled = []
        row = 0
        for i, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            samples = batch.samples(i)
            seq.num_computed_tokens += num_new
            self.block_manager.cache_full_blocks(seq)
            if not samples:
                continue
            group = [seq] + self._fork(seq, seq.num_samples - 1)
            for s in group:
                s.append_token(int(tokens[row]), float(logprobs[row]))
                row += 1
                self._check_stop(s)
            sampled += group
            if seq.request.first_token_time is None:
                seq.request.first_token_time = time.perf_counter()
        return sampled

    def _fork(self, parent: Sequence, num_children: int) -> list[Sequence]:
        if num_children == 0:
            return []
        children = [parent.fork(parent.sample_index + 1 + k) for k in range(num_children)]
        for child in children:
            self.block_manager.fork(child)
        at = self.running.index(parent) + 1
        self.running[at:at] = children
        parent.request.sequences += children
        return children

    def _check_stop(self, seq: Sequence) -> None:
        params, token = seq.params, seq.token_ids[-1]
        max_tokens = params.max_tokens or self.max_model_len
        if seq.num_output_tokens >= max_tokens or seq.num_tokens >= self.max_model_len:
            self.finish(seq, "length")
        elif not params.ignore_eos and token in seq.request.eos_token_ids:
            self.finish(seq, "stop")
        elif token in params.stop_token_ids:
            self.finish(seq, "stop", stop_reason=token)

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """End seq now ("stop" | "length") and free its blocks."""
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        self.running.remove(seq)
        self.block_manager.free(seq)
        if seq.request.finished:
            seq.request.finished_time = time.perf_counter()
