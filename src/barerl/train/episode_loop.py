"""Multi-turn episodes in the engine's step loop: each turn is an engine request, and while one episode
waits for its environment the others decode (continuous batching).

    loop = EpisodeLoop(llm.engine, steps=WorkerPool(64), sampling=SamplingParams(temperature=1.0))
    stats = loop.run(groups)          # groups: lists of Episode; each episode grows turn by turn

Design decisions:
- A continued turn is a new request whose prompt is all of the episode's ids so far. Its KV comes back
  through the prefix cache: the block manager keys each full block by its tokens and the previous block's
  key, so the earlier turns' full blocks are found again and only the tail is computed (the last partial
  block of the earlier turns and the environment's new ids). The cache is emptied once when a run starts
  (the weights may have changed since the last run), never between turns. A waiting episode's blocks sit
  in the free queue, still cached, and are overwritten only when the cache runs short; `EpisodeStats`
  reports the hit rate.
- A group's first turns (same prompt ids: the samples of one prompt) are one request with n samples, so
  the prompt is prefilled once and shared, as in single-turn generation.
- Seeds (`turn_seed`): turn 0 of sample i draws from derive_seed(group_seed, i), what the n-sample request
  gives it; turn t > 0 from two splitmix64 mixes, (group_seed, t) then sample i (a SeedSequence cost 30-80
  us, at every continued turn, on the host while the GPU waits). An episode's tokens depend only on
  (group seed, sample, turn) and its own ids, never on when its environment answered or what it was
  batched with (on the GPU with batch_invariant, not even in the last bit of a log-prob).
- Environment steps run in a WorkerPool. Between engine steps the loop takes in the steps that are done,
  without blocking; it waits for one only when the engine has nothing to run because every unfinished
  episode waits for its environment. That wait is the engine's idle time (`LoopStats.idle_seconds`).
  Then, with a step back, the loop goes on taking in steps while they keep arriving (at most _GATHER_GAP
  apart, for at most _GATHER_SHARE of the longest one's own time): the steps of a batch of turns
  that ended together come back within milliseconds of each other, and the step that admits them costs
  about the same for one turn as for all of them (an eager forward, its launches host-bound), while each
  later arrival would stop the running batch's lookahead for a step of its own.
- Which turns share an engine step depends on how long environment steps take, and on the CPU (or
  the GPU without batch_invariant) a token's log-prob depends in its last bits on what it was batched
  with. `deterministic=True` takes every step in at the engine step after the one that submitted it,
  waiting for it if need be (counted as idle), in the order they were submitted: the batches, and so
  every bit, are then a function of the tokens alone. GRPO asks for it on the CPU, where an engine step
  is slow beside most tool calls; on the GPU with batch_invariant the bits never depend on the batch.
- `on_group_done(g)` is called as soon as group g's last episode has ended (GRPO starts scoring it there).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from barerl.engine.sampling_params import SamplingParams, derive_seed
from barerl.engine.sequence import Request, Sequence
from barerl.train.environments import finished_step
from barerl.train.episode import Episode
from barerl.train.worker_pool import Job, WorkerPool

_WAIT_SECONDS = 1.0  # longest single wait for an environment step while the engine is idle
# seconds between arrivals that still count as one batch (module docstring): Python's thread switch interval, the
# longest a finished step's thread may wait for the interpreter lock before it can report
_GATHER_GAP = 0.005
_GATHER_SHARE = 0.25  # of an environment step's own time, the most that gathering may add to the wait
_LATER_TURNS = 0x5DEECE66DA3B1F47  # turn_seed: mixed into the group seed for the turns after the first


def turn_seed(group_seed: int, sample_index: int, turn: int) -> int:
    """The sampling seed of one turn of one episode (module docstring)."""
    if turn == 0:
        return derive_seed(group_seed, sample_index)
    # indices from 1: derive_seed passes index 0's seed through unmixed
    return derive_seed(derive_seed(group_seed ^ _LATER_TURNS, turn + 1), sample_index + 1)


@dataclass
class LoopStats:
    """Where a run's time went, in seconds."""

    wall_seconds: float = 0.0
    engine_seconds: float = 0.0  # in engine steps
    idle_seconds: float = 0.0  # the engine had nothing to run: every unfinished episode waited for its environment


class EpisodeLoop:
    def __init__(self, engine, steps: WorkerPool, sampling: SamplingParams, step_timeout: float | None = None,
                 deterministic: bool = False):
        """engine: an `engine.Engine`; steps: the pool environment steps run in; sampling: how a turn samples
        (its max_tokens caps one turn, None: what is left of the episode's budget; n, seed and logprobs are
        the loop's); step_timeout: seconds a step may take before its episode ends with an error;
        deterministic: take steps in at fixed engine steps (module docstring)."""
        self.engine, self.steps, self.sampling, self.step_timeout = engine, steps, sampling, step_timeout
        self.deterministic = deterministic
        self._turns: dict[tuple[int, int], Episode] = {}  # (request id, sample index) -> the episode it plays
        self._pending: list[Job] = []  # environment steps not taken in yet, in the order they were submitted
        self._last_turns: dict[Episode, Sequence] = {}  # the sequence of each waiting episode's last turn

    def run(self, groups: list[list[Episode]], on_group_done: Callable[[int], None] | None = None) -> LoopStats:
        """Play every episode to its end; returns where the time went."""
        stats, start = LoopStats(), time.perf_counter()
        self.engine.start([])  # a new run: the prefix cache starts empty
        group_of = {id(e): g for g, group in enumerate(groups) for e in group}
        remaining = [len(group) for group in groups]
        for group in groups:
            self._start(group)
        while any(remaining):
            for episode in self._advance(stats):
                g = group_of[id(episode)]
                remaining[g] -= 1
                if remaining[g] == 0 and on_group_done is not None:
                    on_group_done(g)
        stats.wall_seconds = time.perf_counter() - start
        return stats

    def _advance(self, stats: LoopStats) -> list[Episode]:
        """One engine step if it has work, then the environment steps to take in; the episodes that ended."""
        ended = []
        if self.engine.has_unfinished():
            start = time.perf_counter()
            finished = {seq.seq_id: seq for seq in self.engine.step() if seq.is_finished}
            stats.engine_seconds += time.perf_counter() - start
            ended += [e for e in map(self._end_turn, finished.values()) if e is not None]
        elif not self._pending:
            raise RuntimeError("episode loop: episodes are unfinished but none runs or waits")
        start = time.perf_counter()
        jobs = self._ready_steps(wait=self.deterministic or not self.engine.has_unfinished())
        stats.idle_seconds += time.perf_counter() - start
        return ended + [e for e in map(self._observe, jobs) if e is not None]

    def _ready_steps(self, wait: bool) -> list[Job]:
        """The environment steps done, in the order they were submitted; `wait`: all of them when
        deterministic, else at least one (or _WAIT_SECONDS)."""
        if wait and self.deterministic:
            for job in self._pending:
                job.finished.wait()
        elif wait and self._pending:
            if not any(job.done for job in self._pending):
                self.steps.wait(_WAIT_SECONDS)
            self._gather()
        self.steps.poll()  # the pool's own list of finished jobs: the order kept here is the submission order
        ready = [job for job in self._pending if job.done]
        self._pending = [job for job in self._pending if not job.done]
        return ready

    def _gather(self) -> None:
        """Wait while pending steps keep finishing at most _GATHER_GAP apart, for at most _GATHER_SHARE of the
        longest one's time."""
        done = [job.seconds or 0.0 for job in self._pending if job.done]
        deadline = time.perf_counter() + _GATHER_SHARE * max(done, default=0.0)
        while not all(job.done for job in self._pending):
            left = deadline - time.perf_counter()
            if left <= 0 or not self.steps.wait(min(_GATHER_GAP, left)):
                return

    # ---------------------------------------------------------------------------------------------- requests

    def _start(self, group: list[Episode]) -> None:
        """The group's first turns: one request with n samples when they share a prompt, else one each."""
        first = group[0]
        shared = all(e.prompt_ids == first.prompt_ids and e.group_seed == first.group_seed
                     and e.budget == first.budget for e in group)
        if shared and [e.sample_index for e in group] == list(range(len(group))):
            self._add(group, first.prompt_ids, first.group_seed, first.room)
            return
        for e in group:
            self._add([e], e.prompt_ids, turn_seed(e.group_seed, e.sample_index, 0), e.room)

    def _continue(self, episode: Episode, computed: int, previous: Sequence) -> None:
        """The episode's next turn; `computed`: its tokens whose KV an earlier turn left in the cache, the last
        turn's sequence `previous` holding them."""
        block_size = self.engine.config.block_size
        episode.turn_reusable = computed // block_size * block_size
        episode.reusable_tokens += episode.turn_reusable
        seed = turn_seed(episode.group_seed, episode.sample_index, episode.num_turns)
        self._add([episode], episode.ids, seed, episode.room, previous)

    def _add(self, episodes: list[Episode], ids: list[int], seed: int, room: int,
             continues: Sequence | None = None) -> None:
        cap = self.sampling.max_tokens
        params = dataclasses.replace(self.sampling, n=len(episodes), seed=seed, logprobs=True,
                                     max_tokens=min(room, cap) if cap else room)
        request = self.engine.new_request(None, ids, params, continues)
        self._turns.update({(request.request_id, i): e for i, e in enumerate(episodes)})
        self.engine.add(request)

    # ---------------------------------------------------------------------------------------------- events

    def _end_turn(self, seq: Sequence) -> Episode | None:
        """A turn's request finished for one episode: append the turn, then step its environment; returns the
        episode if that ended it."""
        request: Request = seq.request
        episode = self._turns.pop((request.request_id, seq.sample_index))
        if episode.num_turns > 0:  # blocks of another episode's identical tokens may count beyond its own
            episode.cached_tokens += min(request.num_cached_tokens, episode.turn_reusable)
        ids = seq.output_token_ids
        stop_token = seq.finish_reason == "stop" and not isinstance(seq.stop_reason, str)
        text = episode.tokens.text(ids[:-1] if stop_token else ids)
        if not episode.add_turn(ids, seq.output_logprobs, text, cut=seq.finish_reason == "length"):
            return episode
        self._pending.append(self.steps.submit(episode.env.step, text, key=episode, timeout=self.step_timeout))
        self._last_turns[episode] = seq
        return None

    def _observe(self, job: Job) -> Episode | None:
        """An environment step came back: continue its episode, or return it if it ended."""
        episode: Episode = job.key
        episode.step_seconds += job.seconds or 0.0
        computed = len(episode.ids) - 1  # the last sampled token's KV was never computed
        previous = self._last_turns.pop(episode)
        if episode.add_observation(finished_step(job)):
            self._continue(episode, computed, previous)
            return None
        return episode
