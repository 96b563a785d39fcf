"""Training checkpoints: round trip, atomicity under a crash mid-save, rotation, resume lookup."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from train_helpers import random_problem, tiny_cfg

from barerl.model.checkpoint import load_checkpoint
from barerl.model.weights import ParameterBuffer
from barerl.ops import ref
from barerl.train import state as state_mod
from barerl.train.optimizer import AdamW
from barerl.train.state import (
    latest_checkpoint,
    list_checkpoints,
    load_training_state,
    resolve_checkpoint,
    save_training_state,
)


def make_optimizer(seed=0, steps=2):
    cfg = tiny_cfg()
    init, grads = random_problem(cfg, steps=steps + 2, seed=seed)
    opt = AdamW(ParameterBuffer(cfg, init.copy()), ref, weight_decay=0.1)
    for g in grads[:steps]:
        opt.zero_grad()
        opt.grads.flat += g
        opt.step(1e-2)
    return opt, grads[steps:]


def save(tmp_path, step, opt, **kw):
    rng = np.random.default_rng(step)
    return save_training_state(
        tmp_path, step, opt, {"name": "cosine", "step": step}, rng.bit_generator.state,
        {"epoch": 1, "position": np.int64(17)}, {"learning_rate": 1e-2, "report_to": ("jsonl",)},
        {"note": "hi"}, **kw)


def test_round_trip_restores_optimizer_and_state(tmp_path):
    opt, rest = make_optimizer()
    path = save(tmp_path, 2, opt, params=opt.params)
    assert path == tmp_path / "checkpoint-2"
    cfg, params = load_checkpoint(path)  # the model part is a plain Hugging Face folder
    np.testing.assert_array_equal(params.flat, opt.params.flat)

    fresh = AdamW(ParameterBuffer(cfg, np.zeros_like(opt.params.flat)), ref, weight_decay=0.1)
    st = load_training_state(path, fresh)
    assert (st.step, st.optimizer_step, fresh.step_count) == (2, 2, 2)
    assert st.scheduler == {"name": "cosine", "step": 2} and st.extra == {"note": "hi"}
    assert st.data == {"epoch": 1, "position": 17} and st.config["report_to"] == ["jsonl"]
    rng = np.random.default_rng()
    rng.bit_generator.state = st.rng
    assert rng.random() == np.random.default_rng(2).random()
    for a, b in ((opt, rest), (fresh, rest)):  # both continue identically
        for g in b:
            a.zero_grad()
            a.grads.flat += g
            a.step(1e-2)
    np.testing.assert_array_equal(fresh.params.flat, opt.params.flat)


def test_exception_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    opt, _ = make_optimizer()
    save(tmp_path, 10, opt)
    before = (tmp_path / "checkpoint-10" / "trainer_state" / "state.json").read_text()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(state_mod, "write_safetensors", boom)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path, 20, opt)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-10"
    assert (tmp_path / "checkpoint-10" / "trainer_state" / "state.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10"]  # the temp folder was removed


def test_hard_crash_mid_save_leaves_previous_checkpoint_latest(tmp_path):
    """The process dies (no cleanup runs) while writing checkpoint-20: checkpoint-10 stays the latest."""
    opt, _ = make_optimizer()
    save(tmp_path, 10, opt)
    script = textwrap.dedent(f"""
        import os, pathlib
        import numpy as np
        from barerl.ops import ref
        from barerl.config import ModelConfig
        from barerl.model.weights import ParameterBuffer
        from barerl.train import state
        from barerl.train.optimizer import AdamW
        real = state.write_safetensors
        def die(*a, **k):
            real(*a, **k)  # the optimizer file is written, the state file never is
            os._exit(9)
        state.write_safetensors = die
        cfg = ModelConfig.from_dict({opt.params.cfg.to_dict()!r})
        opt = AdamW(ParameterBuffer.zeros(cfg, np, np.float32), ref)
        state.save_training_state(pathlib.Path({str(tmp_path)!r}), 20, opt, {{}}, None, {{}}, {{}})
    """)
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-checkpoint-20")]
    assert leftovers  # a partial save is on disk ...
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-10"  # ... and ignored
    save(tmp_path, 30, opt)  # the next save cleans it up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-30"]


def test_incomplete_checkpoint_folder_is_ignored(tmp_path):
    opt, _ = make_optimizer()
    save(tmp_path, 5, opt)
    (tmp_path / "checkpoint-9").mkdir()  # e.g. copied by hand, no trainer state
    (tmp_path / "checkpoint-notanumber").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-5"
    assert latest_checkpoint(tmp_path / "missing") is None


def test_rotation_deletes_oldest_after_new_is_complete(tmp_path):
    opt, _ = make_optimizer()
    for step in (1, 2, 3, 4):
        save(tmp_path, step, opt, save_total_limit=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]


def test_saving_the_same_step_again_replaces_it(tmp_path):
    opt, _ = make_optimizer()
    save(tmp_path, 3, opt)
    save_training_state(tmp_path, 3, opt, {}, None, {}, {}, {"second": True})
    assert load_training_state(tmp_path / "checkpoint-3").extra == {"second": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]


def test_resolve_checkpoint_and_errors(tmp_path):
    assert resolve_checkpoint(tmp_path, None) is None
    assert resolve_checkpoint(tmp_path, "latest") is None
    opt, _ = make_optimizer()
    path = save(tmp_path, 7, opt)
    assert resolve_checkpoint(tmp_path, "latest") == path
    assert resolve_checkpoint(tmp_path, str(path)) == path
    with pytest.raises(FileNotFoundError, match="not a complete training checkpoint"):
        resolve_checkpoint(tmp_path, str(tmp_path / "nope"))
    state_file = path / "trainer_state" / "state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "format_version": 99}))
    with pytest.raises(ValueError, match="format_version 99"):
        load_training_state(path)
    with pytest.raises(TypeError, match="cannot store object"):
        save_training_state(tmp_path, 8, opt, {}, object(), {}, {})
    assert latest_checkpoint(tmp_path) == path
