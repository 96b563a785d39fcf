"""Learning-rate schedules against transformers.get_scheduler, step for step."""

import pytest
import torch
from transformers import get_scheduler

from barerl.train.schedule import make_schedule, resolve_total_steps, resolve_warmup_steps


def hf_lrs(name, lr, total, warmup):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=total)
    lrs = []
    for _ in range(total + 3):  # a few steps past the end: linear/cosine must stay at 0
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("name", ["linear", "cosine", "constant_with_warmup"])
@pytest.mark.parametrize("total,warmup", [(20, 0), (20, 5), (7, 7), (1, 0), (13, 4)])
def test_matches_transformers(name, total, warmup):
    sched = make_schedule(name, 3e-4, total, warmup_steps=warmup)
    want = hf_lrs(name, 3e-4, total, warmup)
    got = [sched.lr(s) for s in range(total + 3)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_constant_without_warmup_matches_and_with_warmup_warms_up():
    assert [make_schedule("constant", 1e-3, 10).lr(s) for s in range(10)] == hf_lrs("constant", 1e-3, 10, 0)[:10]
    assert make_schedule("constant", 1e-3, 10, warmup_steps=4).lr(0) == 0.0
    assert make_schedule("constant", 1e-3, 10, warmup_steps=4).lr(4) == 1e-3


def test_warmup_ratio_rounds_up_like_the_trainer_and_steps_win():
    assert resolve_warmup_steps(100, 0, 0.03) == 3
    assert resolve_warmup_steps(10, 0, 0.15) == 2
    assert resolve_warmup_steps(10, 3, 0.5) == 3
    assert make_schedule("cosine", 1.0, 10, warmup_ratio=0.15).num_warmup_steps == 2


def test_bad_name_is_named():
    with pytest.raises(ValueError, match="lr_scheduler_type.*'cosin'"):
        make_schedule("cosin", 1e-3, 10)


def test_total_steps():
    assert resolve_total_steps(10, 3.0, 100) == 10
    assert resolve_total_steps(-1, 3.0, 7) == 21
    assert resolve_total_steps(-1, 0.5, 7) == 4
