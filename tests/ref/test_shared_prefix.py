"""The reference's SharedPrefix contract: `paged_attention` with a true statement of shared blocks attends
exactly as without it, and a false statement (which the CUDA kernels would turn into wrong keys) raises."""

import numpy as np
import pytest

from barerl.backend import ref
from barerl.backend.ref.nn import check_shared_prefix

BLOCK, H, K, D = 4, 4, 2, 8  # 2 query heads per kv head: groups of up to 8 members
SHARED_BLOCKS = [0, 1, 2]  # the first 12 keys of every sequence


def decode_step(num_seqs=4, seed=0):
    """One new token per sequence, each with its own last two blocks after the shared ones."""
    rng = np.random.default_rng(seed)
    caches = [rng.standard_normal((32, BLOCK, K, D)).astype(np.float32) for _ in range(2)]
    tables = np.array([SHARED_BLOCKS + [3 + 2 * s, 4 + 2 * s] for s in range(num_seqs)], np.int32)
    context_lens = np.array([14 + s % 4 for s in range(num_seqs)], np.int32)
    q = rng.standard_normal((num_seqs, H, D)).astype(np.float32)
    cu = np.arange(num_seqs + 1, dtype=np.int32)
    return q, caches, tables, context_lens, cu


def attend(step, shared=None):
    q, (k_cache, v_cache), tables, context_lens, cu = step
    return ref.paged_attention(q, k_cache, v_cache, tables, context_lens, cu, D**-0.5, shared_prefix=shared)


def prefix(lens, sizes):
    return ref.SharedPrefix(np.array(lens, np.int32), np.array(sizes, np.int32))


@pytest.mark.parametrize("shared", [prefix([12] * 4, [4, 0, 0, 0]), prefix([5, 5, 12, 12], [2, 0, 2, 0]),
                                    prefix([0, 8, 8, 8], [0, 3, 0, 0]), prefix([0] * 4, [0] * 4)],
                         ids=["one-group", "two-groups", "three-of-four", "no-group"])
def test_a_true_statement_changes_nothing(shared):
    step = decode_step()
    np.testing.assert_array_equal(attend(step, shared), attend(step))


@pytest.mark.parametrize(("shared", "message"), [
    (prefix([13] * 4, [4, 0, 0, 0]), r"first 13 keys are not in the same physical blocks"),
    (prefix([15] * 4, [4, 0, 0, 0]), r"prefix length \(1\.\.its context length\), got \[15, 15, 15, 15\]"),
    (prefix([12, 12, 8, 12], [4, 0, 0, 0]), r"every member needs the same prefix length"),
    (prefix([12, 12, 0, 12], [2, 0, 0, 0]), r"a shared-prefix length is set for a sequence in no group"),
    (prefix([12] * 4, [3, 2, 0, 0]), r"group at sequence 1 of 2 members does not fit .*groups may not overlap"),
    (prefix([12] * 4, [0, 0, 3, 0]), r"group at sequence 2 of 3 members does not fit \(S = 4"),
    (prefix([12] * 3, [3, 0, 0]), r"\(S,\) lens and group_sizes; got 4 tokens, 4 sequences, \(3,\)"),
], ids=["blocks-not-shared", "lens-past-a-context", "unequal-lens", "lens-outside-a-group", "overlap",
        "past-the-batch", "wrong-shape"])
def test_a_false_statement_raises(shared, message):
    with pytest.raises(ValueError, match=message):
        attend(decode_step(), shared)


def test_a_group_over_the_member_limit_raises():
    members = ref.MAX_SHARED_PREFIX_MEMBERS
    step = decode_step(num_seqs=members + 1)
    S = len(step[2])
    attend(step, prefix([12] * (S - 1) + [0], [S - 1] + [0] * (S - 1)))
    with pytest.raises(ValueError, match=rf"of {S} members does not fit \(S = {S}, at most {members} members"):
        attend(step, prefix([12] * S, [S] + [0] * (S - 1)))


def test_a_shared_prefix_needs_a_decode_step():
    q, caches, tables, context_lens, _ = decode_step()
    q = np.concatenate([q, q[:1]])  # the last sequence has two new tokens
    cu = np.array([0, 1, 2, 3, 5], np.int32)
    with pytest.raises(ValueError, match=r"needs a decode step \(one new token per sequence\).*got 5 tokens, 4"):
        ref.paged_attention(q, *caches, tables, context_lens, cu, D**-0.5,
                            shared_prefix=prefix([12] * 4, [4, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"needs a decode step"):
        check_shared_prefix(prefix([12] * 4, [4, 0, 0, 0]), tables, context_lens, 5, BLOCK)
