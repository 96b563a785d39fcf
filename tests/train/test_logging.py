"""MetricsLogger: metrics.jsonl per step, samples, optional TensorBoard/W&B, resume, plot and summary."""

import json
import sys
import types

import numpy as np
import pytest

from barerl.train.metrics import MetricsLogger, read_metrics, summarize_metrics


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_flushed_line_per_step_and_progress_postfix(tmp_path):
    logger = MetricsLogger(tmp_path, total_steps=3)
    logger.log(1, {"loss": np.float32(0.5), "reward": 0.25, "num_tokens": 1000, "grad_norm": float("nan")})
    first = lines(tmp_path / "metrics.jsonl")  # readable before close: flushed
    assert len(first) == 1 and first[0]["step"] == 1 and first[0]["loss"] == 0.5
    assert first[0]["grad_norm"] is None  # non-finite -> null (strict JSON)
    assert first[0]["tokens_per_second"] > 0
    postfix = logger.bar.postfix
    assert "reward=0.25" in postfix and "loss=0.5" in postfix and "tok/s=" in postfix
    logger.log(2, {"loss": 0.4, "tokens_per_second": 123.0})
    assert logger.bar.n == 2
    logger.close()
    assert [r["step"] for r in lines(tmp_path / "metrics.jsonl")] == [1, 2]
    assert lines(tmp_path / "metrics.jsonl")[1]["tokens_per_second"] == 123.0


def test_samples(tmp_path):
    with MetricsLogger(tmp_path, total_steps=1, show_progress=False) as logger:
        logger.log_samples(4, ["1+1="], ["2"], [1.0], math=[1.0])
        with pytest.raises(ValueError, match="different lengths"):
            logger.log_samples(4, ["a", "b"], ["c"], [0.0, 1.0])
    assert lines(tmp_path / "samples.jsonl") == [
        {"step": 4, "prompt": "1+1=", "completion": "2", "reward": 1.0, "math": 1.0}]


def test_resume_drops_steps_after_the_checkpoint_and_keeps_time(tmp_path):
    with MetricsLogger(tmp_path, total_steps=5, show_progress=False) as logger:
        for step in range(1, 5):
            logger.log(step, {"loss": 1.0 / step})
        logger.log_samples(3, ["p"], ["c"], [0.0])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # a torn line from a crash
    last_time = read_metrics(tmp_path / "metrics.jsonl")[1]["time"]
    with MetricsLogger(tmp_path, total_steps=5, start_step=2, show_progress=False) as logger:
        assert logger.bar.n == 2
        logger.log(3, {"loss": 0.3})
    records = lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[2]["time"] >= last_time
    assert not (tmp_path / "samples.jsonl").read_text()  # the step-3 sample is dropped too


def test_missing_optional_backends_are_skipped_with_a_notice(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with MetricsLogger(tmp_path, 1, report_to=("jsonl", "tensorboard", "wandb"), show_progress=False) as lg:
        lg.log(1, {"loss": 1.0})
    err = capsys.readouterr().err
    assert "tensorboardX is not installed" in err and "wandb is not installed" in err
    assert len(lines(tmp_path / "metrics.jsonl")) == 1


def test_tensorboard_and_wandb_receive_numbers_when_installed(tmp_path, monkeypatch):
    calls = []

    class Writer:
        def __init__(self, logdir):
            calls.append(("tb_init", logdir))

        def add_scalar(self, key, value, step):
            calls.append(("tb", key, value, step))

        def close(self):
            calls.append(("tb_close",))

    class Run:
        def log(self, data, step):
            calls.append(("wandb", data, step))

        def finish(self):
            calls.append(("wandb_finish",))

    monkeypatch.setitem(sys.modules, "tensorboardX", types.SimpleNamespace(SummaryWriter=Writer))
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: Run()))
    with MetricsLogger(tmp_path, 1, report_to=("tensorboard", "wandb"), show_progress=False) as lg:
        lg.log(7, {"loss": 0.5, "note": "text is not a scalar"})
    assert ("tb", "loss", 0.5, 7) in calls
    wandb_logs = [c for c in calls if c[0] == "wandb"]
    assert wandb_logs[0][1]["loss"] == 0.5 and "note" not in wandb_logs[0][1] and wandb_logs[0][2] == 7
    assert ("tb_close",) in calls and ("wandb_finish",) in calls


def fill(tmp_path, n=20):
    with MetricsLogger(tmp_path, n, show_progress=False) as logger:
        for step in range(1, n + 1):
            logger.log(step, {"loss": 2.0 / step, "reward": step / n, "reward_std": 0.1,
                              "rewards/math/mean": step / n, "rewards/format/mean": 1.0, "num_tokens": 100})
    return logger


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = fill(tmp_path).plot()
    assert path == tmp_path / "curves.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_so(tmp_path, monkeypatch, capsys):
    logger = fill(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert logger.plot() is None
    assert "matplotlib is not installed" in capsys.readouterr().err


def test_summary(tmp_path):
    text = fill(tmp_path).summary()
    assert text.splitlines()[0].startswith("steps: 20 (20 logged)")
    assert "reward: 0.075 -> 0.975 (best 1 at step 20)" in text
    assert "loss: 1.5 -> 0.1026" in text and "tokens/s" in text
    assert summarize_metrics(tmp_path / "missing.jsonl") == "no steps logged"
