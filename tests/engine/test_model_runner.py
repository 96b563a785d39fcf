"""The step's host arrays (the contract the CUDA model runner and graphs consume), on a hand-built batch."""

import numpy as np

from barerl.engine.model_runner import prepare_step
from barerl.engine.sampling_params import SamplingParams, derive_seed
from barerl.engine.scheduler import Scheduler
from barerl.engine.sequence import Request


def test_prepare_step_arrays_for_a_mixed_step():
    sched = Scheduler(16, 4, max_num_seqs=8, max_num_batched_tokens=8, max_model_len=64)
    decoding = Request(0, None, [1, 2, 3], SamplingParams(temperature=0, max_tokens=9), seed=5)
    parent = Request(1, None, list(range(10, 20)), SamplingParams(n=2, top_k=3, top_p=0.5, min_tokens=2),
                     seed=7, eos_token_ids=(0,))
    sched.add(decoding)
    first = sched.schedule()
    sched.update(first, [9], [0.0])
    sched.add(parent)
    batch = sched.schedule()  # decoding's 4th token (position 3) + the first 7 of parent's 10 prompt tokens
    step = prepare_step(batch, block_size=4)
    d, p = list(decoding.sequences[0].block_table), list(parent.sequences[0].block_table)
    np.testing.assert_array_equal(step.input_ids, [9, 10, 11, 12, 13, 14, 15, 16])
    np.testing.assert_array_equal(step.positions, [3, 0, 1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(step.cu_seqlens_q, [0, 1, 8])
    np.testing.assert_array_equal(step.context_lens, [4, 7])
    np.testing.assert_array_equal(step.block_tables, [[d[0], -1, -1], p])
    parent_slots = [p[i // 4] * 4 + i % 4 for i in range(7)]
    np.testing.assert_array_equal(step.slot_mapping, [d[0] * 4 + 3, *parent_slots])
    np.testing.assert_array_equal(step.sample_rows, [0])  # parent's chunk does not reach its end
    assert not step.is_decode_only
    metadata = (step.input_ids, step.positions, step.cu_seqlens_q, step.block_tables, step.slot_mapping)
    assert all(a.dtype == np.int32 for a in metadata)
    sched.update(batch, [4], [0.0])

    batch = sched.schedule()  # decode + parent's last 3 prompt tokens: 2 samples from one row
    step = prepare_step(batch, block_size=4)
    np.testing.assert_array_equal(step.sample_rows, [0, 1, 1])
    np.testing.assert_array_equal(step.temperature, [0, 1, 1])
    np.testing.assert_array_equal(step.top_k, [0, 3, 3])
    np.testing.assert_allclose(step.top_p, [1, 0.5, 0.5])
    np.testing.assert_array_equal(step.seeds, np.array([5, derive_seed(7, 0), derive_seed(7, 1)], np.uint64))
    np.testing.assert_array_equal(step.counters, [2, 0, 0])
    np.testing.assert_array_equal(step.banned_rows, [1, 2])  # min_tokens=2 bans EOS (id 0) for both samples
    np.testing.assert_array_equal(step.banned_tokens, [0, 0])
    sched.update(batch, [5, 6, 7], [0.0] * 3)

    batch = sched.schedule()  # three decodes; the two samples share a partial block: one copy-on-write
    step = prepare_step(batch, block_size=4)
    assert step.is_decode_only
    assert len(step.copy_src) == 1 and step.copy_src[0] == p[2] and step.copy_dst[0] != p[2]
    np.testing.assert_array_equal(step.counters, [3, 1, 1])
