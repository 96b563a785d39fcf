"""Scheduler, pure Python (no model): budgets, chunked prefill, mixed steps, continuous batching,
preemption."""

import itertools

import pytest

from barerl.engine.sampling_params import SamplingParams
from barerl.engine.scheduler import Scheduler
from barerl.engine.sequence import Request

_ids = itertools.count()


def make_request(num_prompt_tokens, max_tokens=4, n=1):
    """Prompts never share tokens (no prefix-cache hits between them)."""
    first = 100 * next(_ids)
    tokens = list(range(first, first + num_prompt_tokens))
    params = SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=True)
    return Request(first, None, tokens, params, seed=0)


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=32, chunked=True, max_model_len=64):
    return Scheduler(num_blocks, block_size, max_num_seqs, budget, max_model_len, chunked)


def step(sched):
    """Schedule, then feed token 7 to every sample the step draws."""
    batch = sched.schedule()
    plan = [(s.request.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)]
    num_samples = sum(s.num_samples for i, s in enumerate(batch.seqs) if batch.samples(i))
    sched.update(batch, [7] * num_samples, [0.0] * num_samples)
    return plan


def test_chunked_prefill_splits_a_long_prompt_and_mixes_with_decode():
    sched = make_scheduler(budget=8)
    short, long = make_request(3, max_tokens=5), make_request(20)
    sched.add(short)
    assert step(sched) == [(short.request_id, 3)]
    sched.add(long)
    assert step(sched) == [(short.request_id, 1), (long.request_id, 7)]  # decode first, then a chunk
    assert step(sched) == [(short.request_id, 1), (long.request_id, 7)]
    assert step(sched) == [(short.request_id, 1), (long.request_id, 6)]
    assert long.sequences[0].num_output_tokens == 1  # the last chunk sampled its first token
    assert step(sched) == [(short.request_id, 1), (long.request_id, 1)]


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    sched = make_scheduler(budget=8, chunked=False)
    a, b = make_request(6, max_tokens=3), make_request(5)
    sched.add(a)
    sched.add(b)
    assert step(sched) == [(a.request_id, 6)]  # b does not fit in the 2 tokens left
    assert step(sched) == [(a.request_id, 1), (b.request_id, 5)]


def test_max_num_seqs_and_continuous_batching():
    sched = make_scheduler(max_num_seqs=2)
    reqs = [make_request(2, max_tokens=m) for m in (1, 3, 2)]
    for r in reqs:
        sched.add(r)
    assert step(sched) == [(reqs[0].request_id, 2), (reqs[1].request_id, 2)]
    assert reqs[0].finished  # max_tokens=1: done, its slot goes to the waiting request in the next step
    assert step(sched) == [(reqs[1].request_id, 1), (reqs[2].request_id, 2)]
    assert sched.block_manager.num_free_blocks == 64 - 2


def test_parent_counts_as_n_sequences_and_forks_after_prefill():
    sched = make_scheduler(max_num_seqs=4)
    parent_req, other = make_request(6, n=3), make_request(2)
    sched.add(parent_req)
    sched.add(other)
    sched.add(make_request(2))
    assert step(sched) == [(parent_req.request_id, 6), (other.request_id, 2)]  # 3 + 1 = 4 slots
    assert len(parent_req.sequences) == 3
    assert [s.sample_index for s in sched.running] == [0, 1, 2, 0]
    tables = [s.block_table for s in parent_req.sequences]
    assert tables[0] == tables[1] == tables[2]
    plan = step(sched)
    assert plan == [(parent_req.request_id, 1)] * 3 + [(other.request_id, 1)]
    assert len({tuple(s.block_table) for s in parent_req.sequences}) == 3  # copy-on-write split


def test_preemption_takes_the_youngest_and_resumes_it_first():
    sched = make_scheduler(num_blocks=4, block_size=2, max_model_len=8, budget=16)
    old, young = make_request(4, max_tokens=4), make_request(4, max_tokens=4)
    sched.add(old)
    sched.add(young)
    step(sched)  # both prefilled: 2 full blocks each, all 4 used
    plan = step(sched)  # both need a new block: young is preempted
    assert plan == [(old.request_id, 1)]
    assert sched.num_preemptions == 1 and sched.waiting[0] is young.sequences[0]
    assert young.sequences[0].num_computed_tokens == 0 and young.sequences[0].num_output_tokens == 1
    while not old.finished:
        step(sched)
    assert step(sched) == [(young.request_id, 5)]  # prompt and first token recomputed (cache evicted)
    while not young.finished:
        step(sched)
    assert young.sequences[0].num_output_tokens == 4


def test_nothing_fits_raises():
    sched = make_scheduler(num_blocks=2, block_size=2, max_model_len=64)
    sched.add(make_request(9))
    with pytest.raises(RuntimeError, match="nothing fits"):
        sched.schedule()


def run_with_lookahead(sched, num_steps):
    """Schedule with lookahead until done, feeding token 7 to every sample; the steps of each schedule."""
    steps_per_schedule = []
    while sched.has_unfinished():
        batch = sched.schedule(num_steps)
        steps_per_schedule.append(batch.num_steps)
        for single, _ in sched.step_batches(batch):
            num_samples = sum(s.num_samples for i, s in enumerate(single.seqs) if single.samples(i))
            sched.update(single, [7] * num_samples, [0.0] * num_samples)
    return steps_per_schedule


def test_a_sequence_near_its_end_does_not_hold_the_batch_to_single_steps():
    sched = make_scheduler(num_blocks=128, max_model_len=128)
    short, long = make_request(4, max_tokens=3), make_request(4, max_tokens=17)
    sched.add(short)
    sched.add(long)
    # prefill (one token each), then 8 + 8 steps: short's steps past its third token are dropped
    assert run_with_lookahead(sched, 8) == [1, 8, 8]
    assert short.sequences[0].num_output_tokens == 3 and short.sequences[0].finish_reason == "length"
    assert long.sequences[0].num_output_tokens == 17


def test_lookahead_needs_a_sequence_that_takes_half_its_steps_and_positions_for_all():
    sched = make_scheduler(num_blocks=128, max_model_len=128)
    sched.add(make_request(4, max_tokens=4))  # 3 tokens left after prefill: fewer than half of 8
    assert run_with_lookahead(sched, 8) == [1, 1, 1, 1]
    sched = make_scheduler(num_blocks=128, max_model_len=10)
    near_the_end = make_request(4, max_tokens=100)  # 6 positions left: no room for 8 steps' keys
    sched.add(near_the_end)
    assert run_with_lookahead(sched, 8) == [1] * 6
    assert near_the_end.sequences[0].finish_reason == "length"


def test_positions_past_max_model_len_let_a_lookahead_run_to_its_end():
    """The engine's block tables hold 2K - 1 positions past max_model_len: the last tokens before it take one
    lookahead batch (its steps past max_model_len dropped), not a single step each."""
    sched = Scheduler(128, 4, 8, 32, max_model_len=10, table_positions=10 + 15)
    near_the_end = make_request(4, max_tokens=100)  # 6 positions left before max_model_len
    sched.add(near_the_end)
    assert run_with_lookahead(sched, 8) == [1, 8]
    seq = near_the_end.sequences[0]
    assert seq.finish_reason == "length" and seq.num_tokens == 10


def test_a_continuation_runs_on_while_one_sequence_may_take_half_its_steps():
    sched = make_scheduler(num_blocks=128, max_model_len=128)
    short, long = make_request(4, max_tokens=3), make_request(4, max_tokens=13)
    sched.add(short)
    sched.add(long)
    step(sched)  # prefill: one token each
    first = sched.schedule(8)
    assert first.num_steps == 8
    following = sched.schedule_continuation(first)  # long has 12 tokens left: 4 after first's 8, half of 8
    assert following is not None and following.num_steps == 8 and following.seqs == first.seqs
    for batch in (first, following):
        for single, _ in sched.step_batches(batch):
            sched.update(single, [7] * len(single.seqs), [0.0] * len(single.seqs))
    assert short.sequences[0].num_output_tokens == 3 and long.sequences[0].num_output_tokens == 13
    assert not sched.has_unfinished()
    sched = make_scheduler(num_blocks=128, max_model_len=128)
    sched.add(make_request(4, max_tokens=12))  # 11 left after prefill: 3 after the first 8, under half
    step(sched)
    assert sched.schedule_continuation(sched.schedule(8)) is None
