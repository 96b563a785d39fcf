"""Reference AdamW op and the AdamW class against torch.optim.AdamW (fp32, decay only on non-norm/bias)."""

import numpy as np
import pytest
import torch
from train_helpers import random_problem, tiny_cfg

from barerl.model.weights import ParameterBuffer, is_norm_or_bias
from barerl.ops import ref
from barerl.ops.ref import adamw as ref_adamw
from barerl.train.optimizer import AdamW

HYPER = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def torch_adamw(cfg, init, grads_per_step, max_grad_norm=None, lrs=None):
    """HF Trainer's grouping: weight decay on everything but norms and biases."""
    named = {n: torch.nn.Parameter(torch.from_numpy(v.copy())) for n, v in ParameterBuffer(cfg, init)}
    groups = [
        {"params": [p for n, p in named.items() if not is_norm_or_bias(n)], "weight_decay": HYPER["weight_decay"]},
        {"params": [p for n, p in named.items() if is_norm_or_bias(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=HYPER["lr"], betas=HYPER["betas"], eps=HYPER["eps"])
    for i, g in enumerate(grads_per_step):
        for n, p in named.items():
            p.grad = torch.from_numpy(ParameterBuffer(cfg, g)[n].copy())
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(list(named.values()), max_grad_norm)
        if lrs is not None:
            for group in opt.param_groups:
                group["lr"] = lrs[i]
        opt.step()
    return {n: p.detach().numpy() for n, p in named.items()}


def assert_close(name, got, want, tol=1e-6):
    err = np.abs(got - want).max()
    rel = err / max(np.abs(want).max(), 1e-12)
    assert err <= tol, f"{name}: max abs err {err:.3g}, max rel err {rel:.3g}"


def test_grad_norm_matches_numpy_and_accumulates_in_fp32():
    g = np.random.default_rng(1).standard_normal(3 * ref_adamw.CHUNK // 2 + 7).astype(np.float32)
    assert ref.grad_norm(g) == pytest.approx(float(np.linalg.norm(g.astype(np.float64))), rel=1e-6)
    import ml_dtypes

    gb = g.astype(ml_dtypes.bfloat16)  # bf16 storage, fp32 math
    assert ref.grad_norm(gb) == pytest.approx(float(np.linalg.norm(gb.astype(np.float64))), rel=1e-5)


def test_adamw_step_op_matches_torch():
    cfg = tiny_cfg()
    init, grads = random_problem(cfg, steps=5)
    want = torch_adamw(cfg, init, grads)
    master = init.copy()
    m, v = np.zeros_like(master), np.zeros_like(master)
    mask = np.ones_like(master, dtype=np.uint8)
    for name, (off, shape) in ParameterBuffer(cfg, master).offsets.items():
        if is_norm_or_bias(name):
            mask[off : off + int(np.prod(shape))] = 0
    for step, g in enumerate(grads, start=1):
        ref.adamw_step(master, g, m, v, mask, HYPER["lr"], *HYPER["betas"], HYPER["eps"],
                       HYPER["weight_decay"], step)
    for name, got in ParameterBuffer(cfg, master):
        assert_close(name, got, want[name])


def test_adamw_step_writes_working_weights_and_checks_shapes():
    import ml_dtypes

    master = np.linspace(-1, 1, 10, dtype=np.float32)
    work = np.zeros(10, dtype=ml_dtypes.bfloat16)
    ref.adamw_step(master, np.ones(10, np.float32), np.zeros(10, np.float32), np.zeros(10, np.float32), None,
                   0.1, 0.9, 0.999, 1e-8, 0.0, 1, working_out=work)
    np.testing.assert_array_equal(work, master.astype(ml_dtypes.bfloat16))
    with pytest.raises(ValueError, match="exp_avg has shape"):
        ref.adamw_step(master, master, np.zeros(3, np.float32), master, None, 0.1, 0.9, 0.9, 1e-8, 0.0, 1)


@pytest.mark.parametrize("tied", [False, True])
def test_adamw_class_matches_torch_with_clipping_and_lr_changes(tied):
    cfg = tiny_cfg(tie_word_embeddings=tied)
    init, grads = random_problem(cfg, steps=6, seed=2)
    lrs = [1e-2, 5e-3, 2e-3, 1e-3, 1e-3, 0.0]
    want = torch_adamw(cfg, init, grads, max_grad_norm=20.0, lrs=lrs)
    params = ParameterBuffer(cfg, init.copy())
    opt = AdamW(params, ref, betas=HYPER["betas"], eps=HYPER["eps"], weight_decay=HYPER["weight_decay"],
                max_grad_norm=20.0)
    assert opt.shares_master  # fp32 working weights are the master copy
    clipped = []
    for g, lr in zip(grads, lrs):
        opt.zero_grad()
        opt.grads.flat += g
        metrics = opt.step(lr)
        assert metrics["grad_norm"] == pytest.approx(float(np.linalg.norm(g.astype(np.float64))), rel=1e-6)
        clipped.append(metrics["clipped"])
    assert 1.0 in clipped  # the test exercises clipping (norm of a random grad here is ~sqrt(N) > 20)
    for name, got in params:
        assert_close(name, got, want[name])


def test_bf16_working_weights_follow_master_and_grad_scale_is_applied():
    import ml_dtypes

    cfg = tiny_cfg()
    init, grads = random_problem(cfg, steps=3, seed=3)
    want = torch_adamw(cfg, init, grads)
    params = ParameterBuffer(cfg, init.astype(ml_dtypes.bfloat16))
    opt = AdamW(params, ref, betas=HYPER["betas"], eps=HYPER["eps"], weight_decay=HYPER["weight_decay"],
                max_grad_norm=None)
    opt.master[...] = init  # exact fp32 start, as a loaded fp32 checkpoint would give
    for g in grads:
        opt.zero_grad()
        opt.grads.flat += 4 * g
        opt.step(HYPER["lr"], grad_scale=0.25)
    for name, got in ParameterBuffer(cfg, opt.master):
        assert_close(name, got, want[name])
    np.testing.assert_array_equal(params.flat, opt.master.astype(ml_dtypes.bfloat16))


def test_stochastic_rounding_is_unbiased_between_the_two_neighbours():
    import ml_dtypes

    gap = 2.0**-7  # bf16 spacing in [1, 2)
    for fraction in (0.0, 0.1, 0.5, 0.93):
        for sign in (1.0, -1.0):
            x = np.full(100_000, sign * (1.0 + fraction * gap), np.float32)
            y = ref.stochastic_round_bfloat16(x, seed=7, step=3).astype(np.float32)
            assert set(np.unique(np.abs(y))) <= {1.0, np.float32(1.0 + gap)}
            assert abs(float(y.mean()) - float(x[0])) < 4 * gap / np.sqrt(len(x)) + 1e-9
    x = np.array([np.inf, -np.inf, np.nan, 0.0, 1e-40], np.float32)
    y = ref.stochastic_round_bfloat16(x, seed=1, step=1)
    assert np.isposinf(y[0]) and np.isneginf(y[1]) and np.isnan(y[2]) and y[3] == 0
    assert y.dtype == ml_dtypes.bfloat16


def test_updates_below_bf16_resolution_reach_the_working_weights_only_when_rounding_stochastically():
    """A bf16 checkpoint puts the master on the bf16 grid; 20 steps of lr 1e-5 move it by ~2e-4, a fortieth
    of bf16's spacing at 1.0. Round-to-nearest never shows the move; stochastic rounding shows it on average."""
    import ml_dtypes

    n = 200_000
    start = np.ones(n, np.float32)
    moved = {}
    for seed in (None, 0):
        master, m, v = start.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
        working = start.astype(ml_dtypes.bfloat16)
        for step in range(1, 21):
            ref.adamw_step(master, -np.ones(n, np.float32), m, v, None, lr=1e-5, beta1=0.9, beta2=0.999,
                           eps=1e-8, weight_decay=0.0, step=step, working_out=working, rounding_seed=seed)
        moved[seed] = float(working.astype(np.float64).mean() - 1.0)
    target = float(master[0]) - 1.0
    assert abs(target - 2e-4) < 1e-5
    assert moved[None] == 0.0
    assert abs(moved[0] - target) < 0.1 * target


def test_bf16_stochastic_rounding_resumes_the_same_working_weights():
    import ml_dtypes

    cfg = tiny_cfg()
    init, grads = random_problem(cfg, steps=4, seed=5)

    def optimizer(flat):
        return AdamW(ParameterBuffer(cfg, flat.astype(ml_dtypes.bfloat16)), ref, rounding_seed=11)

    def run(opt, gs):
        for g in gs:
            opt.zero_grad()
            opt.grads.flat += g
            opt.step(1e-3)

    a = optimizer(init)
    run(a, grads)
    b = optimizer(init)
    run(b, grads[:2])
    state = {**b.state_dict(), "arrays": {k: v.copy() for k, v in b.state_dict()["arrays"].items()}}
    c = optimizer(np.zeros_like(init))
    c.load_state_dict(state)
    np.testing.assert_array_equal(c.params.flat.view(np.uint16), b.params.flat.view(np.uint16))
    run(c, grads[2:])
    np.testing.assert_array_equal(c.params.flat.view(np.uint16), a.params.flat.view(np.uint16))
    assert not np.array_equal(a.params.flat, a.master.astype(ml_dtypes.bfloat16))  # not nearest


def test_non_finite_gradient_skips_the_step():
    cfg = tiny_cfg()
    params = ParameterBuffer(cfg, np.ones(ParameterBuffer.zeros(cfg, np, np.float32).flat.shape, np.float32))
    opt = AdamW(params, ref)
    opt.grads.flat[5] = np.nan
    metrics = opt.step(1e-3)
    assert metrics["skipped"] == 1.0 and opt.step_count == 0
    assert np.all(params.flat == 1.0)


def test_state_dict_roundtrip_continues_identically():
    cfg = tiny_cfg()
    init, grads = random_problem(cfg, steps=4, seed=4)

    def run(opt, gs):
        for g in gs:
            opt.zero_grad()
            opt.grads.flat += g
            opt.step(1e-2)

    kw = {"weight_decay": 0.1, "max_grad_norm": 1.0}
    a = AdamW(ParameterBuffer(cfg, init.copy()), ref, **kw)
    run(a, grads)
    b = AdamW(ParameterBuffer(cfg, init.copy()), ref, **kw)
    run(b, grads[:2])
    state = {**b.state_dict(), "arrays": {k: v.copy() for k, v in b.state_dict()["arrays"].items()}}
    c = AdamW(ParameterBuffer(cfg, np.zeros_like(init)), ref, **kw)
    c.load_state_dict(state)
    assert c.step_count == 2
    run(c, grads[2:])
    np.testing.assert_array_equal(c.params.flat, a.params.flat)
    with pytest.raises(ValueError, match="exp_avg"):
        c.load_state_dict({**state, "arrays": {**state["arrays"], "exp_avg": np.zeros(3, np.float32)}})


def test_from_config():
    import ml_dtypes

    from barerl.train.config import GRPOConfig

    cfg = GRPOConfig(adam_beta2=0.95, weight_decay=0.1, max_grad_norm=None)
    opt = AdamW.from_config(ParameterBuffer.zeros(tiny_cfg(), np, np.float32), ref, cfg)
    assert (opt.beta1, opt.beta2, opt.weight_decay, opt.max_grad_norm) == (0.9, 0.95, 0.1, None)
    assert opt.rounding_seed is None  # fp32 working weights: nothing to round
    bf16 = ParameterBuffer.zeros(tiny_cfg(), np, ml_dtypes.bfloat16)
    assert AdamW.from_config(bf16, ref, cfg).rounding_seed == cfg.seed
    no_sr = GRPOConfig(stochastic_rounding=False)
    assert AdamW.from_config(bf16, ref, no_sr).rounding_seed is None
    assert opt.decay_mask is not None and 0 < int(opt.decay_mask.sum()) < opt.decay_mask.size


def test_adamw_step_in_slices_with_offsets_equals_one_call():
    """Stochastic rounding draws element i's bits from its index in the whole buffer (`offset` + i)."""
    import ml_dtypes

    n, cut = 1000, 377
    rng = np.random.default_rng(8)
    master, grad = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    args = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "step": 3,
            "rounding_seed": 5}
    whole = [master.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, ml_dtypes.bfloat16)]
    ref.adamw_step(whole[0], grad, whole[1], whole[2], None, working_out=whole[3], **args)
    parts = [master.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, ml_dtypes.bfloat16)]
    for rows in (slice(0, cut), slice(cut, n)):
        p, m, v, w = (a[rows] for a in parts)
        ref.adamw_step(p, grad[rows], m, v, None, working_out=w, offset=rows.start, **args)
    for got, want in zip(parts, whole, strict=True):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def _streamed_and_plain(device: str, dtype: str, chunk: int, monkeypatch, share: float = 1.0, steps: int = 4):
    """The same steps on two AdamWs, one offloaded (`share` of its state streamed, `chunk` elements at a
    time), one not."""
    import ml_dtypes

    from barerl.ops import get_backend
    from barerl.train import optimizer as optimizer_module

    monkeypatch.setattr(optimizer_module, "STREAM_CHUNK", chunk)
    backend = get_backend(device)
    if device == "cpu":
        xp = np
    else:
        import cupy as xp
    cfg = tiny_cfg()
    init, grads = random_problem(cfg, steps=steps, seed=6)
    streamed_length = init.shape[0] - round((1 - share) * init.shape[0])
    assert streamed_length % chunk != 0 and streamed_length // chunk >= 3  # a short last chunk, slots reused
    work = init.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
    opts = [AdamW(ParameterBuffer(cfg, xp.array(work)), backend, weight_decay=0.1, max_grad_norm=20.0,
                  rounding_seed=11) for _ in range(2)]
    streamed, plain = opts
    streamed.offload(share)
    for g in grads:
        for opt in opts:
            opt.zero_grad()
            opt.grads.flat += xp.asarray(g)
            opt.step(1e-2)
        assert streamed.offloaded and not plain.offloaded  # the state stays split
    return streamed, plain


def _bits(array):
    array = array.get() if hasattr(array, "get") else array
    return np.ascontiguousarray(array).view(np.uint8)


def _low_halves(opt):
    master = opt.master
    return (master.get() if hasattr(master, "get") else master).view(np.uint32).astype(np.uint16)


def _assert_same_steps(streamed, plain) -> None:
    """Working weights, and the split state (each part where it lives, then whole again), bit for bit."""
    kept = streamed.kept
    np.testing.assert_array_equal(_bits(streamed.params.flat), _bits(plain.params.flat))
    # bf16: the master went as its low halves (the working weights hold the rest); fp32 shares the model's
    assert ("master_low16" in streamed._host) == (plain.params.flat.dtype != np.float32)
    for key, host in streamed._host.items():
        whole = {"decay_mask": plain.decay_mask, "master_low16": _low_halves(plain)}.get(key)
        whole = getattr(plain, key) if whole is None else whole
        assert isinstance(host, np.ndarray)  # (pinned) host memory on the GPU
        np.testing.assert_array_equal(_bits(host), _bits(whole[kept:]), key)
        np.testing.assert_array_equal(_bits(streamed._device[key]), _bits(whole[:kept]), key)
    streamed.offload()  # already there: only the gradients go
    assert streamed._grads is None and streamed.offloaded
    arrays = streamed.state_dict()["arrays"]  # restores the whole state on the device
    assert not streamed.offloaded
    for key in ("master", "exp_avg", "exp_avg_sq"):
        np.testing.assert_array_equal(_bits(arrays[key]), _bits(getattr(plain, key)), key)


@pytest.mark.parametrize("share", [1.0, 0.6])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_offloaded_steps_stream_the_state_and_equal_plain_steps_bit_for_bit(monkeypatch, dtype, share):
    """bf16: a separate master, stochastic rounding keyed by each chunk's offset; fp32: the master is the
    model's own buffer (shares_master), only the moments stream. share 0.6: the first 40% stays on the device
    and is updated there."""
    streamed, plain = _streamed_and_plain("cpu", dtype, 97 if share == 1 else 61, monkeypatch, share)
    assert streamed.shares_master == (dtype == "float32")
    assert (plain.rounding_seed is not None) == (dtype == "bfloat16")
    n = plain.params.flat.shape[0]
    assert streamed.kept == n - round(share * n) and (streamed.kept > 0) == (share < 1)
    _assert_same_steps(streamed, plain)


def test_a_master_held_as_its_low_halves_steps_as_the_fp32_one():
    """The reference's master_low16: rebuilt from the working weights each step, updated, its low half kept;
    the same bits as the fp32 master, step after step (offsets included)."""
    import ml_dtypes

    from barerl.ops.ref.adamw import master_from_low16

    n, offset, seed = 5000, 123, 7
    rng = np.random.default_rng(0)
    master = (rng.standard_normal(n) * 0.05).astype(ml_dtypes.bfloat16).astype(np.float32)  # on the grid: step 0
    moments = [np.zeros(n, np.float32), np.zeros(n, np.float32)]
    split = [np.zeros(n, np.float32), np.zeros(n, np.float32)]
    working, working_split = master.astype(ml_dtypes.bfloat16), master.astype(ml_dtypes.bfloat16)
    low = master.view(np.uint32).astype(np.uint16)
    for step in range(1, 5):
        grad = rng.standard_normal(n).astype(np.float32)
        args = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1, "step": step,
                "rounding_seed": seed, "offset": offset}
        ref.adamw_step(master, grad, *moments, None, working_out=working, **args)
        ref.adamw_step(None, grad, *split, None, working_out=working_split, master_low16=low, **args)
        np.testing.assert_array_equal(_bits(working_split), _bits(working))
        np.testing.assert_array_equal(_bits(np.stack(split)), _bits(np.stack(moments)))
        np.testing.assert_array_equal(_bits(master_from_low16(working_split, low, seed, step, offset)), _bits(master))
    with pytest.raises(ValueError, match="rounding_seed"):
        ref.adamw_step(None, grad, *split, None, working_out=working_split, master_low16=low,
                       **{**args, "rounding_seed": None})


@pytest.mark.parametrize("case", ["nearest rounding", "a master the working weights do not round from"])
def test_offloading_keeps_an_fp32_master_where_the_working_weights_cannot_rebuild_it(case):
    """Round-to-nearest working weights, or a master that is not their stochastic rounding's source (a
    checkpoint's, say): the master goes to the host whole, and the steps still equal the plain ones."""
    import ml_dtypes

    cfg = tiny_cfg()
    init, grads = random_problem(cfg, steps=3, seed=6)
    seed = None if case == "nearest rounding" else 11
    opts = [AdamW(ParameterBuffer(cfg, init.astype(ml_dtypes.bfloat16)), ref, rounding_seed=seed) for _ in range(2)]
    if seed is not None:
        for opt in opts:
            opt.master[7] += 1.0  # a bf16 step away, at least: no rounding of it gives the working weight
    streamed, plain = opts
    streamed.offload(0.5)
    assert "master" in streamed._host and "master_low16" not in streamed._host
    for g in grads:
        for opt in opts:
            opt.zero_grad()
            opt.grads.flat += g
            opt.step(1e-2)
    np.testing.assert_array_equal(_bits(streamed.params.flat), _bits(plain.params.flat))
    np.testing.assert_array_equal(_bits(streamed.state_dict()["arrays"]["master"]), _bits(plain.master))


def test_an_offload_after_a_restore_may_hold_the_master_in_the_other_form():
    """A master the working weights could not rebuild goes whole; after a restore (a checkpoint) the steps have
    made it their rounding's source, so the next offload sends its low halves, and only those stream."""
    import ml_dtypes

    cfg = tiny_cfg()
    init, grads = random_problem(cfg, steps=3, seed=6)
    opts = [AdamW(ParameterBuffer(cfg, init.astype(ml_dtypes.bfloat16)), ref, rounding_seed=11) for _ in range(2)]
    for opt in opts:
        opt.master[7] += 1.0
    streamed, plain = opts
    forms = []
    for g in grads:
        streamed.offload(0.5)
        forms.append(sorted(key for key in streamed._host if key.startswith("master")))
        for opt in opts:
            opt.zero_grad()
            opt.grads.flat += g
            opt.step(1e-2)
        streamed.state_dict()  # restores
    assert forms == [["master"], ["master_low16"], ["master_low16"]]
    np.testing.assert_array_equal(_bits(streamed.params.flat), _bits(plain.params.flat))
    np.testing.assert_array_equal(_bits(streamed.master), _bits(plain.master))


@pytest.mark.parametrize("share", [1.0, 0.6])
@pytest.mark.parametrize("case", ["bf16, stochastic", "bf16, nearest", "fp32"])
def test_an_optimizer_born_offloaded_equals_one_offloaded_after_its_start(monkeypatch, case, share):
    """`AdamW(offload=share)` makes the state in its two places without a whole copy of any state array on the
    device (ParameterBuffer.zeros is never called), and equals a resident optimizer offloaded before its first
    step: the same parts where they live, the same steps, bit for bit, weight decay mask included."""
    import ml_dtypes

    from barerl.train import optimizer as optimizer_module

    monkeypatch.setattr(optimizer_module, "STREAM_CHUNK", 61)
    monkeypatch.setattr(optimizer_module, "CHECK_CHUNK", 50)  # the master widened in several chunks
    cfg = tiny_cfg()
    init, grads = random_problem(cfg, steps=3, seed=9)
    dtype, seed = {"bf16, stochastic": (ml_dtypes.bfloat16, 11), "bf16, nearest": (ml_dtypes.bfloat16, None),
                   "fp32": (np.float32, 11)}[case]

    def make(offload=None):
        return AdamW(ParameterBuffer(cfg, init.astype(dtype)), ref, weight_decay=0.1, rounding_seed=seed,
                     offload=offload)

    later = make()
    later.offload(share)
    with monkeypatch.context() as m:
        m.setattr(ParameterBuffer, "zeros", lambda *a, **k: pytest.fail("a whole state array was made"))
        born = make(offload=share)
    assert born.offloaded and born._grads is None and born.kept == later.kept
    assert born._host.keys() == later._host.keys() == born._device.keys()
    for key in born._host:
        np.testing.assert_array_equal(_bits(born._host[key]), _bits(later._host[key]), key)
        np.testing.assert_array_equal(_bits(born._device[key]), _bits(later._device[key]), key)
    for g in grads:
        for opt in (born, later):
            opt.zero_grad()
            opt.grads.flat += g
            opt.step(1e-2)
    np.testing.assert_array_equal(_bits(born.params.flat), _bits(later.params.flat))
    for key, array in born.state_dict()["arrays"].items():  # restored whole
        np.testing.assert_array_equal(_bits(array), _bits(later.state_dict()["arrays"][key]), key)
    assert born._grads is None  # a restore drops the gradients (zeros again when next asked for)


def test_offload_share_must_be_a_fraction():
    opt = AdamW(ParameterBuffer.zeros(tiny_cfg(), np, np.float32), ref)
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match="share"):
            opt.offload(share)


@pytest.mark.gpu
@pytest.mark.parametrize("share", [1.0, 0.6])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_offloaded_steps_stream_through_pinned_memory_on_the_gpu(monkeypatch, dtype, share):
    """The CUDA path: async copies on two streams, the fused kernel per chunk (and on the kept part, on the
    current stream); bits equal the plain steps'."""
    streamed, plain = _streamed_and_plain("cuda", dtype, 1000 if share == 1 else 611, monkeypatch, share)
    _assert_same_steps(streamed, plain)
