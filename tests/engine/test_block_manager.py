"""Block manager, pure Python: allocation, prefix cache (chained, LRU), fork and copy-on-write."""

from barerl.engine.block_manager import BlockManager
from barerl.engine.sampling_params import SamplingParams
from barerl.engine.sequence import Request


def make_seq(tokens, n=1):
    return Request(0, None, list(tokens), SamplingParams(n=n), seed=0).sequences[0]


def admit(bm, seq):
    hits = bm.lookup(seq)
    assert bm.can_allocate(seq, hits)
    bm.allocate(seq, hits)
    return hits


def compute_all(bm, seq):
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)


def test_allocate_covers_every_token_and_free_returns_blocks():
    bm = BlockManager(8, 4)
    seq = make_seq(range(10))
    assert admit(bm, seq) == []
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5 and seq.num_computed_tokens == 0
    bm.free(seq)
    assert bm.num_free_blocks == 8 and seq.block_table == []


def test_prefix_hit_after_free_and_never_on_the_last_token():
    bm = BlockManager(8, 4)
    a = make_seq(range(12))
    admit(bm, a)
    compute_all(bm, a)
    blocks_a = list(a.block_table)
    bm.free(a)
    b = make_seq(list(range(8)) + [99, 98, 97])
    assert admit(bm, b) == blocks_a[:2]  # two full blocks in common
    assert b.num_computed_tokens == 8
    c = make_seq(range(12))  # the whole prompt cached: the last block is recomputed for its logits
    assert bm.lookup(c) == blocks_a[:2]


def test_chained_hash_needs_the_same_prefix():
    bm = BlockManager(8, 4)
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit(bm, a)
    compute_all(bm, a)
    b = make_seq([0, 0, 0, 0, 5, 6, 7, 8, 9])  # second block equal, first not
    assert bm.lookup(b) == []


def test_shared_blocks_count_references():
    bm = BlockManager(8, 4)
    a, b = make_seq(range(9)), make_seq(range(9))
    admit(bm, a)
    compute_all(bm, a)
    assert admit(bm, b) == a.block_table[:2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    bm.free(a)
    assert bm.blocks[b.block_table[0]].ref_count == 1 and b.block_table[0] not in bm.free_block_ids


def test_lru_eviction_keeps_recently_freed_prefixes():
    bm = BlockManager(6, 2)
    a, b = make_seq([1, 2, 3]), make_seq([5, 6, 7])
    for seq in (a, b):
        admit(bm, seq)
        compute_all(bm, seq)
        bm.free(seq)
    c = make_seq([8, 9, 10])  # two blocks: the never-used ones go first, a's and b's survive
    admit(bm, c)
    assert bm.lookup(make_seq([1, 2, 3])) and bm.lookup(make_seq([5, 6, 7]))
    bm.free(c)
    d = make_seq([11, 12, 13, 14, 15])  # three blocks: a's, freed longest ago, goes; b's stays
    admit(bm, d)
    assert not bm.lookup(make_seq([1, 2, 3])) and bm.lookup(make_seq([5, 6, 7]))


def test_fork_shares_blocks_and_copy_on_write_splits_the_partial_block():
    bm = BlockManager(8, 4)
    parent = make_seq(range(6), n=3)  # 6 tokens: a full block and a partial one
    admit(bm, parent)
    compute_all(bm, parent)
    children = [parent.fork(1), parent.fork(2)]
    for child in children:
        bm.fork(child)
    for seq in [parent, *children]:
        seq.token_ids.append(50 + seq.sample_index)
    shared_full, shared_partial = parent.block_table
    assert bm.blocks[shared_partial].ref_count == 3
    copies = [bm.append_slots(s, 1) for s in [parent, *children]]
    assert copies[0] and copies[1] and copies[2] == []  # the last holder keeps the original
    assert [c[0][0] for c in copies[:2]] == [shared_partial, shared_partial]
    assert children[1].block_table == [shared_full, shared_partial]
    assert bm.blocks[shared_full].ref_count == 3 and bm.blocks[shared_partial].ref_count == 1
    assert len({s.block_table[1] for s in [parent, *children]}) == 3


def test_append_takes_a_new_block_at_a_block_boundary():
    bm = BlockManager(4, 4)
    seq = make_seq(range(4))
    admit(bm, seq)
    compute_all(bm, seq)
    seq.token_ids.append(7)
    assert bm.num_blocks_to_append(seq, 1) == 1
    assert bm.append_slots(seq, 1) == [] and len(seq.block_table) == 2


def test_no_prefix_caching_means_no_hits():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    a = make_seq(range(9))
    admit(bm, a)
    compute_all(bm, a)
    assert bm.lookup(make_seq(range(9))) == []


def test_reset_prefix_cache_forgets_blocks():
    bm = BlockManager(8, 4)
    a = make_seq(range(9))
    admit(bm, a)
    compute_all(bm, a)
    bm.free(a)
    bm.reset_prefix_cache()
    assert bm.lookup(make_seq(range(9))) == []



def test_a_continuing_sequence_finds_by_its_hint_what_a_lookup_by_keys_finds():
    bm = BlockManager(16, 4)
    a = make_seq(range(14))  # three full blocks and a partial one
    admit(bm, a)
    compute_all(bm, a)
    blocks = list(a.block_table)
    bm.free(a)
    assert [block for block, _ in a.released_blocks] == blocks[:3]  # the cached ones, not the partial one
    tokens = list(range(14)) + [90, 91, 92]
    b = make_seq(tokens)
    b.prefix_hint = a.released_blocks
    assert bm.lookup(b) == bm.lookup(make_seq(tokens)) == blocks[:3]


def test_a_hint_stops_at_a_block_evicted_since():
    bm = BlockManager(4, 2)
    a = make_seq([1, 2, 3, 4, 5, 6, 7])  # four blocks: three full, one partial
    admit(bm, a)
    compute_all(bm, a)
    bm.free(a)  # tail first: the partial block is the first to be taken again, then the third, the second
    admit(bm, make_seq([9, 9, 9, 9, 9]))  # three blocks: only the first of a's is left cached
    b = make_seq([1, 2, 3, 4, 5, 6, 7, 8])
    b.prefix_hint = a.released_blocks
    assert bm.lookup(b) == [a.released_blocks[0][0]]
