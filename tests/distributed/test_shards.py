"""The pieces of data parallelism that need no second process: the summation tree and the ranks' blocks of
it, the shard layout, the gradient norm's independence of the sharding, and AdamW over shards (ZeRO-1)
against AdamW over the whole buffer, bit for bit (bf16 stochastic rounding, weight decay, offload)."""

import itertools
import math
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from barerl.distributed.layout import ShardLayout, rank_blocks, tree_sum
from barerl.distributed.norm import block_sums_of_squares
from barerl.model.weights import ParameterBuffer
from barerl.ops import ref
from barerl.train.optimizer import AdamW

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_helpers import random_problem, tiny_cfg


def add_into(a, b):
    a += b


@pytest.mark.parametrize("num_ranks", [1, 2, 4, 8, 3])
def test_ranks_subtrees_joined_over_ranks_are_the_one_rank_tree(num_ranks):
    rng = np.random.default_rng(0)
    for num_items in range(19):
        leaves = [rng.standard_normal(7).astype(np.float32) * 10.0 ** rng.integers(-3, 4) for _ in range(num_items)]
        blocks = rank_blocks(num_items, num_ranks)
        assert [i for b in blocks for i in b] == list(range(num_items))  # contiguous, in order, everything
        if not num_items:
            continue
        partials = [tree_sum([leaves[i].copy() for i in b], add_into) if len(b) else np.zeros(7, np.float32)
                    for b in blocks]
        joined = tree_sum(partials, add_into)
        one_rank = tree_sum([leaf.copy() for leaf in leaves], add_into)
        if num_ranks & (num_ranks - 1) == 0:  # a power of two: the bits of one rank
            np.testing.assert_array_equal(joined, one_rank, f"{num_items} items")
        else:
            np.testing.assert_allclose(joined, one_rank, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n, ranks, bucket", [(10_007, 2, 1000), (300, 8, 64), (1 << 16, 3, 1 << 20), (5, 2, 2)])
def test_shards_cover_the_buffer_in_grain_multiples_and_buckets_cover_the_shards(n, ranks, bucket):
    layout = ShardLayout.build(n, ranks, bucket)
    shards = [layout.shard(r) for r in range(ranks)]
    assert shards[0].start == 0 and shards[-1].stop == n
    assert all(a.stop == b.start for a, b in itertools.pairwise(shards))
    assert all(s.start % layout.grain == 0 or s.start == n for s in shards)  # empty ones sit at the end
    for r, shard in enumerate(shards):
        pieces = [layout.piece_of(r, k) for k in range(layout.num_buckets)]
        assert [i for p in pieces for i in range(p.start, p.stop)] == list(range(shard.start, shard.stop))
        assert max(p.stop - p.start for p in pieces) <= max(1, bucket // ranks)


@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_the_gradient_norm_does_not_depend_on_the_sharding(ranks):
    rng = np.random.default_rng(1)
    grad = (rng.standard_normal(50_001) * np.exp(rng.standard_normal(50_001) * 4)).astype(np.float32)
    layout = ShardLayout.build(grad.shape[0], ranks, 1 << 20)
    whole = block_sums_of_squares(grad, 0, grad.shape[0], layout.grain)
    parts = np.concatenate([block_sums_of_squares(grad, s.start, s.stop, layout.grain)
                            for s in map(layout.shard, range(ranks))])
    np.testing.assert_array_equal(parts, whole)
    norm = math.sqrt(math.fsum(whole.tolist()))
    assert norm == pytest.approx(float(np.linalg.norm(grad.astype(np.float64))), rel=1e-14)


@pytest.mark.parametrize("offload", [None, 0.5])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_adamw_over_shards_writes_the_weights_of_adamw_over_the_whole_buffer(dtype, offload):
    cfg = tiny_cfg()
    init, grads = random_problem(cfg, steps=3, seed=4)
    working = init.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
    options = {"weight_decay": 0.1, "max_grad_norm": 1.0, "rounding_seed": 9 if dtype == "bfloat16" else None}
    whole = AdamW(ParameterBuffer(cfg, working.copy()), ref, **options)
    layout = ShardLayout.build(init.shape[0], 3, 1 << 20)
    shards = [AdamW(ParameterBuffer(cfg, working.copy()), ref, shard=layout.shard(r), **options) for r in range(3)]
    for g in grads:
        norm = float(np.linalg.norm(g.astype(np.float64)))
        for opt in [whole, *shards]:
            if offload:
                opt.offload(offload)
            opt.zero_grad()
            opt.grads.flat += g
            opt.step(1e-2, grad_norm=norm)
        for opt in shards:  # the all-gather of the updated weights
            for other in shards:
                other.params.flat[opt.shard] = opt.params.flat[opt.shard]
    for opt in shards:
        np.testing.assert_array_equal(opt.params.flat.view(np.uint8), whole.params.flat.view(np.uint8))
    state = whole.state_dict()
    for key, array in state["arrays"].items():
        joined = np.concatenate([opt.state_dict()["arrays"][key] for opt in shards])
        np.testing.assert_array_equal(joined, array, key)
    resumed = AdamW(ParameterBuffer(cfg, np.zeros_like(working)), ref, shard=layout.shard(1), **options)
    resumed.load_state_dict(state)  # a whole checkpoint: the shard takes its part, and its working weights
    np.testing.assert_array_equal(resumed.working.view(np.uint8), whole.working[layout.shard(1)].view(np.uint8))


def test_a_sharded_adamw_needs_the_global_norm():
    cfg = tiny_cfg()
    opt = AdamW(ParameterBuffer.zeros(cfg, np, np.float32), ref, shard=slice(0, 256))
    with pytest.raises(ValueError, match="grad_norm"):
        opt.step(1e-3)
