"""SIGINT / SIGTERM during training: the step in progress is finished (or, in GRPO's rollouts, abandoned), a
checkpoint is saved, the command that resumes is printed, and the resumed run is the run never stopped. Also
save_total_limit's default and save_only_model."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from train_helpers import (
    cli,
    grpo_config,
    metrics,
    read_jsonl,
    run_grpo,
    run_sft,
    sft_config,
    write_model_folder,
)

from barerl.model.model import Model
from barerl.train.interrupts import StopSignals, TrainingInterrupted
from barerl.train.session import TrainingSession
from barerl.train.state import OPTIMIZER_FILE, STATE_DIR


def signal_at_step(monkeypatch, step: int, signum=signal.SIGTERM):
    """Send `signum` to this process while the optimizer step that ends step `step` runs."""
    optimizer_step = TrainingSession.optimizer_step

    def step_and_signal(self):
        if self.step + 1 == step:
            os.kill(os.getpid(), signum)
        return optimizer_step(self)

    monkeypatch.setattr(TrainingSession, "optimizer_step", step_and_signal)


@pytest.mark.parametrize("loop", ["sft", "grpo"])
def test_a_signal_mid_step_finishes_the_step_saves_it_and_the_resume_loses_nothing(tmp_path, monkeypatch, loop):
    run = run_sft if loop == "sft" else run_grpo
    config = sft_config if loop == "sft" else grpo_config
    run(config(tmp_path / "whole", max_steps=4, save_steps=0))
    signal_at_step(monkeypatch, 2)
    with pytest.raises(TrainingInterrupted, match=r"SIGTERM: stopped after step 2 of 4; saved .*checkpoint-2\n"
                                                  r"resume with: the same call with resume_from_checkpoint="):
        run(config(tmp_path / "cut", max_steps=4, save_steps=0))
    monkeypatch.undo()
    assert [r["step"] for r in metrics(tmp_path / "cut")] == [1, 2]
    run(config(tmp_path / "cut", max_steps=4, save_steps=0, resume_from_checkpoint="latest"))
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


def interrupting_reward(at_call: int):
    """A reward that sends SIGINT to the trainer on its `at_call`-th call, i.e. during those rollouts."""
    calls = []

    def starts_with_seven(prompts, completions, **_):  # the name of the reward it stands for, in the metrics
        calls.append(1)
        if len(calls) == at_call:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the main thread handles it meanwhile
        return [float(c.startswith("7")) for c in completions]

    return starts_with_seven


def test_a_signal_during_grpo_rollouts_abandons_them_and_saves_the_last_finished_step(tmp_path):
    run_grpo(grpo_config(tmp_path / "whole", max_steps=4))
    per_step = 4  # 32 completions in groups of 8: one reward call per group
    with pytest.raises(TrainingInterrupted, match=r"SIGINT: stopped after step 2 of 4; saved .*checkpoint-2"):
        run_grpo(grpo_config(tmp_path / "cut", max_steps=4), reward_funcs=[interrupting_reward(2 * per_step + 1)])
    assert [r["step"] for r in metrics(tmp_path / "cut")] == [1, 2]
    run_grpo(grpo_config(tmp_path / "cut", max_steps=4, resume_from_checkpoint="latest"))
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


def test_a_signal_before_the_first_step_ends_saves_nothing(tmp_path):
    with pytest.raises(TrainingInterrupted, match="SIGINT: stopped before the first step ended; nothing to save"):
        run_grpo(grpo_config(tmp_path, max_steps=4), reward_funcs=[interrupting_reward(1)])
    assert not list(tmp_path.glob("checkpoint-*"))


def test_a_second_signal_stops_at_once_and_before_training_the_first_does():
    with StopSignals() as stop:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)  # nothing to save yet
        stop.training = True
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal_name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back


def test_sigterm_to_the_cli_saves_and_prints_the_command_that_resumes(tmp_path):
    folder, data = write_model_folder(tmp_path)
    common = ["sft", "--model", folder, "--dataset", data, "--save_steps", 0, "--per_device_train_batch_size", 4,
              "--packing", "false", "--lr_scheduler_type", "constant"]  # the same rates whatever max_steps
    args = [*common, "--output_dir", tmp_path / "cut", "--max_steps", 1000]
    proc = subprocess.Popen([sys.executable, "-m", "barerl.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    metrics_file = tmp_path / "cut" / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None and not (
            metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    stopped = next(line for line in err.splitlines() if line.startswith("SIGTERM: stopped after step"))
    step = int(stopped.split()[4])
    assert f"saved {tmp_path / 'cut' / f'checkpoint-{step}'}" in stopped
    command = shlex.split(err.split("resume with: ")[1].splitlines()[0])
    assert command[:2] == ["barerl", "sft"] and command[-1] == "--resume"
    resumed = cli(*command[1:], "--max_steps", step + 2)  # the printed command, run a little further
    assert resumed.returncode == 0, resumed.stderr
    assert cli(*common, "--output_dir", tmp_path / "whole", "--max_steps", step + 2).returncode == 0
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


def test_save_total_limit_keeps_two_checkpoints_by_default(tmp_path):
    run_sft(sft_config(tmp_path, max_steps=5, save_steps=1))
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-5"]


def test_save_only_model_checkpoints_load_as_models_and_refuse_to_resume(tmp_path):
    result = run_sft(sft_config(tmp_path, max_steps=2, save_only_model=True))
    checkpoint = tmp_path / "checkpoint-2"
    assert not (checkpoint / STATE_DIR / OPTIMIZER_FILE).exists()
    assert Model.from_pretrained(result.checkpoint).params.flat.size
    with pytest.raises(ValueError, match="saved with save_only_model, it holds no optimizer state and cannot be "
                                         f"resumed; start a new run from its weights with --model {checkpoint}"):
        run_sft(sft_config(tmp_path, max_steps=4, resume_from_checkpoint="latest"))
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 2


def test_a_signal_during_a_save_stops_once_it_is_written(tmp_path, monkeypatch):
    import barerl.train.session as session_module

    write = session_module.save_training_state

    def write_signalled(*args, **kwargs):
        path = write(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return path

    monkeypatch.setattr(session_module, "save_training_state", write_signalled)
    with pytest.raises(TrainingInterrupted, match=r"stopped after step 2 of 4; saved .*checkpoint-2\n"):
        run_grpo(grpo_config(tmp_path, max_steps=4, save_steps=2))
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2]


def test_a_signal_between_steps_stops_before_the_next_rollouts(tmp_path, monkeypatch):
    from barerl.train.optimizer import AdamW

    offload, calls = AdamW.offload, []

    def offload_signalled(self, *args):  # called before the first round and after each generation batch
        calls.append(1)
        offload(self, *args)
        if len(calls) == 3:  # after step 2
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(AdamW, "offload", offload_signalled)
    with pytest.raises(TrainingInterrupted, match=r"stopped after step 2 of 4; saved .*checkpoint-2\n"):
        run_grpo(grpo_config(tmp_path, max_steps=4, offload_optimizer=True))
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2]
    assert len(calls) == 3  # the third round was never generated
