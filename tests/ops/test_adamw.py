"""Fused AdamW and grad-norm kernels against the reference optimizer ops."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import BF16, DTYPES, FP32, assert_close, f32, poison, poisoned

from barerl.ops import ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("grad_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("work_dtype", [BF16, FP32, None], ids=str)
@pytest.mark.parametrize("masked", [True, False])
def test_adamw_step(draw, grad_dtype, work_dtype, masked):
    import cupy

    from barerl.ops import cuda

    n = 1_000_003
    master = draw.normal((n,), FP32)
    grad = draw.normal((n,), grad_dtype, 1e-2)
    exp_avg = draw.normal((n,), FP32, 1e-3)
    exp_avg_sq = cupy.abs(draw.normal((n,), FP32, 1e-4))
    mask = draw.integers((n,), 2).astype(np.uint8) if masked else None
    working = cupy.empty((n,), work_dtype) if work_dtype is not None else None
    if working is not None:
        poison(working)
    want = [a.copy() for a in (master, exp_avg, exp_avg_sq)]
    args = {
        "lr": 3e-4,
        "beta1": 0.9,
        "beta2": 0.95,
        "eps": 1e-8,
        "weight_decay": 0.1,
        "step": 3,
        "grad_scale": 0.5,
    }
    ref.adamw_step(want[0], f32(grad), want[1], want[2], mask, **args)
    cuda.adamw_step(master, grad, exp_avg, exp_avg_sq, mask, **args, working_out=working)
    for name, got, expect in zip(
        ("master", "exp_avg", "exp_avg_sq"), (master, exp_avg, exp_avg_sq), want, strict=True
    ):
        assert_close(name, got, expect, FP32)
    if working is not None:  # master rounded once to the working dtype
        assert_close("working", working, want[0], work_dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 1000, 10_000_019])
def test_grad_norm(draw, dtype, n):
    from barerl.ops import cuda

    grad = draw.normal((n,), dtype)
    import cupy

    got, want = cuda.grad_norm(grad), ref.grad_norm(cupy.asnumpy(grad))
    assert isinstance(got, float)
    print(f"grad_norm {got} vs {want}")
    assert abs(got - want) <= 1e-5 * want


def test_stochastic_rounding_matches_the_reference_bit_for_bit(draw):
    """The kernel rounds its updated master into bf16 working weights with the reference's random bits."""
    import cupy

    from barerl.ops import cuda

    n = 1_000_003
    master = draw.normal((n,), FP32)
    master[:4] = cupy.asarray([np.inf, -np.inf, 0.0, -0.0], np.float32)
    grad = draw.normal((n,), FP32, 1e-2)
    moments = [draw.normal((n,), FP32, 1e-3), cupy.abs(draw.normal((n,), FP32, 1e-4))]
    args = {"lr": 1e-6, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "step": 7}
    working = poisoned((n,), BF16)
    cuda.adamw_step(master, grad, *moments, None, **args, working_out=working, rounding_seed=1234)
    want = ref.stochastic_round_bfloat16(master, 1234, 7)
    assert bool((working.view(np.uint16) == want.view(np.uint16)).all())
    nearest = master.astype(BF16).view(np.uint16)
    assert 0 < float((working.view(np.uint16) != nearest).mean()) < 0.75  # rounding is random, not nearest


def test_chunks_with_offsets_round_as_one_launch(draw):
    """A buffer updated in slices, each launch told its slice's offset (the optimizer's streamed step), gets
    the one-launch bits: master, moments and stochastically rounded working weights."""
    import cupy

    from barerl.ops import cuda

    n, cut = 1_000_003, 333_331
    inputs = [draw.normal((n,), FP32), draw.normal((n,), FP32, 1e-3), cupy.abs(draw.normal((n,), FP32, 1e-4))]
    grad, mask = draw.normal((n,), FP32, 1e-2), draw.integers((n,), 2).astype(np.uint8)
    args = {"lr": 1e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1, "step": 5,
            "rounding_seed": 99}
    whole = [a.copy() for a in inputs] + [poisoned((n,), BF16)]
    cuda.adamw_step(whole[0], grad, whole[1], whole[2], mask, **args, working_out=whole[3])
    parts = [a.copy() for a in inputs] + [poisoned((n,), BF16)]
    for rows in (slice(0, cut), slice(cut, n)):
        p, m, v, w = (a[rows] for a in parts)
        cuda.adamw_step(p, grad[rows], m, v, mask[rows], **args, working_out=w, offset=rows.start)
    for name, got, want in zip(("master", "exp_avg", "exp_avg_sq", "working"), parts, whole, strict=True):
        assert bool((got.view(np.uint8) == want.view(np.uint8)).all()), name


def test_a_master_held_as_its_low_halves_steps_as_the_fp32_one(draw):
    """master_low16: the kernel rebuilds each master from its low half and the bf16 working weight (rounded
    stochastically at step - 1), updates it, and keeps the new low half: the fp32 master's bits, step after
    step, with the reference's."""
    import cupy

    from barerl.ops import cuda
    from barerl.ops.ref.adamw import master_from_low16

    n, seed = 1_000_003, 77
    master = draw.normal((n,), FP32)
    working = ref.stochastic_round_bfloat16(master, seed, 4)  # as step 4 left them
    low = master.view(np.uint32).astype(np.uint16)
    moments = [draw.normal((n,), FP32, 1e-3), cupy.abs(draw.normal((n,), FP32, 1e-4))]
    split = [m.copy() for m in moments]
    working_split = working.copy()
    for step in (5, 6):
        grad = draw.normal((n,), FP32, 1e-2)
        args = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "step": step,
                "rounding_seed": seed}
        cuda.adamw_step(master, grad, *moments, None, **args, working_out=working)
        cuda.adamw_step(None, grad, *split, None, **args, working_out=working_split, master_low16=low)
        for name, got, want in (("working", working_split, working), ("exp_avg", split[0], moments[0]),
                                ("exp_avg_sq", split[1], moments[1])):
            assert bool((got.view(np.uint8) == want.view(np.uint8)).all()), (name, step)
        rebuilt = master_from_low16(working_split, low, seed, step)
        assert bool((rebuilt.view(np.uint32) == master.view(np.uint32)).all()), step
