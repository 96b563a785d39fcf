"""The SFT and GRPO loops end to end on tiny models: learning, reproducibility, resume, crash + resume, and
the CLI's errors."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from train_helpers import (
    PROMPTS,
    SFT_ROWS,
    cli,
    grpo_config,
    metrics,
    read_jsonl,
    run_grpo,
    smollm2_like_model,
    stand_in_datasets,
    starts_with_seven,
    tiny_model,
    write_model_folder,
)

from barerl.model.model import Model
from barerl.train.config import GRPOConfig, SFTConfig
from barerl.train.demo import make_tokenizer
from barerl.train.grpo import train_grpo
from barerl.train.sft import train_sft


def test_grpo_raises_reward_where_the_optimum_is_known(tmp_path):
    result = run_grpo(grpo_config(tmp_path, max_steps=12))
    first, last = np.mean(result.rewards[:2]), np.mean(result.rewards[-2:])
    assert last > max(0.5, first + 0.3), result.rewards
    record = metrics(tmp_path)[-1]
    assert record["mismatch/max"] < 1e-4  # engine and trainer run the same ops
    assert os.path.exists(os.path.join(tmp_path, "curves.png")) or "matplotlib" not in sys.modules


@pytest.mark.gpu
def test_grpo_steps_on_the_gpu_equal_the_reference_in_fp32(tmp_path):
    # Two steps: an update and a step on the updated weights. At this learning rate Adam's first updates are
    # about lr * sign(g), so gradient entries at rounding level get full-size updates of opposite signs on
    # the two devices: on the H200 the third step's completions and loss still agreed (loss to 2e-5) but
    # grad_norm differed by 8e-4.
    runs = {}
    for device in ("cpu", "cuda"):
        cfg = grpo_config(tmp_path / device, max_steps=2, device=device, dtype="float32")
        run_grpo(cfg, smollm2_like_model(device, "float32"))
        runs[device] = metrics(tmp_path / device)
    for ref, got in zip(runs["cpu"], runs["cuda"]):
        assert got["reward"] == ref["reward"]  # the same rollouts: the samplers draw the same numbers
        for key in ("loss", "grad_norm", "entropy"):
            assert abs(got[key] - ref[key]) <= 1e-4 * max(abs(ref[key]), 1e-3), (key, got[key], ref[key])


@pytest.mark.gpu
def test_batch_invariant_kernels_leave_no_engine_trainer_mismatch_in_bf16(tmp_path):
    """With batch_invariant (the default) the engine's decode steps and the trainer's packed forward run the
    same arithmetic per token: only the log-softmax's summation order differs (fp32, ~1e-6)."""
    cfg = grpo_config(tmp_path, max_steps=2, device="cuda", dtype="bfloat16", max_completion_length=120)
    model = smollm2_like_model("cuda", "bfloat16", max_position_embeddings=256)
    run_grpo(cfg, model)
    records = metrics(tmp_path)
    assert max(r["mismatch/max"] for r in records) < 1e-5, [r["mismatch/max"] for r in records]


@pytest.mark.gpu
def test_grpo_raises_reward_on_the_gpu_in_bf16(tmp_path):
    cfg = grpo_config(tmp_path, max_steps=12, device="cuda", dtype="bfloat16")
    result = run_grpo(cfg, smollm2_like_model("cuda", "bfloat16"))
    first, last = np.mean(result.rewards[:2]), np.mean(result.rewards[-2:])
    assert last > max(0.5, first + 0.3), result.rewards
    records = metrics(tmp_path)
    assert max(r["mismatch/max"] for r in records) < 0.1
    assert max(r["is_weight/masked_fraction"] for r in records) == 0.0


def test_bf16_working_weights_follow_fp32_training_at_a_small_learning_rate(tmp_path):
    """From a bf16 checkpoint (weights on the bf16 grid), 8 GRPO steps at lr 1e-6 move the bf16 working weights
    as far as fp32 training moves its weights, on average: with round-to-nearest they would keep ~7% of it."""
    import ml_dtypes

    from barerl.model.weights import ParameterBuffer

    cfg = tiny_model().cfg
    start = tiny_model().params.flat.astype(ml_dtypes.bfloat16)
    moved = {}
    for dtype, stochastic in (("float32", False), ("bfloat16", True), ("bfloat16", False)):
        model = Model(cfg, ParameterBuffer(cfg, start.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)),
                      "cpu")
        run_grpo(grpo_config(tmp_path / f"{dtype}{stochastic}", max_steps=8, learning_rate=1e-6, dtype=dtype,
                             stochastic_rounding=stochastic), model)
        moved[dtype, stochastic] = model.params.flat.astype(np.float64) - start.astype(np.float64)
    reference = moved["float32", False]

    def share(d):  # the part of fp32's move that d reproduces
        return float(d @ reference / (reference @ reference))

    assert 0.8 < share(moved["bfloat16", True]) < 1.2
    assert share(moved["bfloat16", False]) < 0.3


def test_truncated_sampling_gives_no_engine_trainer_mismatch(tmp_path):
    run_grpo(grpo_config(tmp_path, max_steps=2, top_k=4, top_p=0.9, min_p=0.05, temperature=0.8))
    assert all(r["mismatch/max"] < 1e-4 for r in metrics(tmp_path))


def test_grpo_rollouts_do_not_depend_on_engine_lookahead(tmp_path, monkeypatch):
    from barerl.engine.model_runner import ModelRunner

    lookaheads = []
    run_steps = ModelRunner.execute_steps
    monkeypatch.setattr(ModelRunner, "execute_steps",
                        lambda self, inputs, k: lookaheads.append(k) or run_steps(self, inputs, k))

    def run(folder, steps):
        cfg = grpo_config(folder, max_completion_length=8, temperature=1.5)
        return train_grpo(cfg, model=tiny_model(), tokenizer=make_tokenizer(), rows=PROMPTS,
                          reward_funcs=[starts_with_seven], show_progress=False,
                          engine_args={"num_kv_blocks": 128, "num_scheduler_steps": steps})

    run(tmp_path / "single", 1)
    assert not lookaheads
    run(tmp_path / "lookahead", 3)
    assert lookaheads
    for single, ahead in zip(metrics(tmp_path / "single"), metrics(tmp_path / "lookahead"), strict=True):
        # the same rollouts; batch shapes differ (a continued lookahead keeps finished rows), so the engine's
        # log-probs differ by ulps, and through the importance weights so do the updates, a little more each step
        for key, value in single.items():
            if key.startswith(("reward", "completions", "num_tokens", "step")):
                assert ahead[key] == value, key
            elif not key.startswith(("mismatch", "is_weight")):
                assert ahead[key] == pytest.approx(value, rel=1e-4, abs=1e-9), key


def test_grpo_sizes_the_kv_cache_for_one_round_of_shared_prompts(tmp_path, monkeypatch):
    """Unless told otherwise, the engine's cache holds one generation round and no more: each prompt's full
    blocks once, each sample's own blocks after them. Prompts of 7 tokens in blocks of 4 (the worst case: 3
    tokens of each prompt in a block of its own), 9-token completions, 32 samples of 4 prompts: 4 x 1 shared
    + 32 x ceil((7 + 9 - 4) / 4) = 100 blocks, with EOS out of the way so every completion is whole. Rollouts
    never wait for blocks and equal those of an ample cache; one block fewer, and sequences are preempted."""
    from barerl.engine.block_manager import BlockManager
    from barerl.engine.scheduler import Scheduler

    sizes, preempted = [], []
    init, preempt = BlockManager.__init__, Scheduler._preempt
    monkeypatch.setattr(BlockManager, "__init__", lambda self, n, *a, **k: sizes.append(n) or init(self, n, *a, **k))
    monkeypatch.setattr(Scheduler, "_preempt", lambda self, seq: preempted.append(seq) or preempt(self, seq))
    monkeypatch.setattr("barerl.engine.llm._eos_token_ids", lambda *_: [])
    rows = [{"prompt": f"{a}+{b}={a + b}+{a}=" + "9" * b} for a in range(4) for b in range(4)]  # >= 7 tokens

    def run(folder, engine_args):
        cfg = grpo_config(folder, max_steps=2, max_prompt_length=7, max_completion_length=9, temperature=1.5)
        train_grpo(cfg, model=tiny_model(), tokenizer=make_tokenizer(), rows=rows, reward_funcs=[starts_with_seven],
                   show_progress=False, engine_args={"block_size": 4, "num_scheduler_steps": 4, **engine_args})

    run(tmp_path / "sized", {})
    run(tmp_path / "ample", {"num_kv_blocks": 1024})
    assert sizes == [100, 1024]
    assert not preempted
    assert metrics(tmp_path / "sized") == metrics(tmp_path / "ample")
    assert metrics(tmp_path / "sized")[0]["completions/mean_length"] == 9
    run(tmp_path / "short", {"num_kv_blocks": 99})
    assert preempted


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_offloading_the_optimizer_changes_nothing(tmp_path, dtype):
    """offload_optimizer moves the state out and back every round (checkpoints saved in between): the same
    metrics and the same weights as keeping it (fp32: a master shared with the model; bf16: a separate one),
    whether all of it goes to the host or 30% of it."""
    runs = {}
    for name, settings in (("resident", {}), ("offloaded", {"offload_optimizer": True}),
                           ("part", {"offload_optimizer": True, "offload_optimizer_ratio": 0.3})):
        cfg = grpo_config(tmp_path / name, dtype=dtype, save_steps=2, gradient_accumulation_steps=2, **settings)
        runs[name] = run_grpo(cfg)
    weights = {name: Model.from_pretrained(run.checkpoint).params.flat for name, run in runs.items()}
    for name in ("offloaded", "part"):
        assert metrics(tmp_path / name) == metrics(tmp_path / "resident")
        np.testing.assert_array_equal(weights[name], weights["resident"])


def test_offloaded_optimizer_state_survives_save_and_load():
    from barerl.ops import ref
    from barerl.train.optimizer import AdamW

    model = tiny_model()
    opt = AdamW(model.params, ref, weight_decay=0.1)
    opt.grads.flat[...] = 0.01
    opt.step(1e-2)
    state = {k: v.copy() for k, v in opt.state_dict()["arrays"].items()}
    opt.offload()
    assert opt.offloaded and opt._grads is None
    assert not opt.grads.flat.any()  # the gradients come back as zeros
    saved = opt.state_dict()  # restores
    assert not opt.offloaded
    for key, value in state.items():
        np.testing.assert_array_equal(saved["arrays"][key], value)
    opt.offload()
    opt.load_state_dict({"step": 1, "arrays": state})
    assert not opt.offloaded and opt.step_count == 1


@pytest.mark.gpu
def test_grpo_with_the_optimizer_offloaded_on_the_gpu(tmp_path):
    """On the GPU, offloading (all of the state, or half) goes through pinned host memory: the same metrics as
    keeping the state."""
    for name, settings in (("resident", {}), ("offloaded", {"offload_optimizer": True}),
                           ("half", {"offload_optimizer": True, "offload_optimizer_ratio": 0.5})):
        cfg = grpo_config(tmp_path / name, max_steps=3, device="cuda", dtype="bfloat16", **settings)
        run_grpo(cfg, smollm2_like_model("cuda", "bfloat16"))
    want = metrics(tmp_path / "resident")
    for got in (metrics(tmp_path / "offloaded"), metrics(tmp_path / "half")):
        for g, w in zip(got, want, strict=True):
            assert g["reward"] == w["reward"]
            for key in ("loss", "grad_norm"):
                assert g[key] == pytest.approx(w[key], rel=1e-3), key  # dQ atomics: sums in any order
        for r in got:  # both phases measured; the arrays in use are part of what the pool reserves
            assert r["memory/generate_gib"] > 0 and r["memory/train_gib"] > 0
            assert r["memory/gpu_gib"] == max(r["memory/generate_gib"], r["memory/train_gib"])
            assert 0 < r["memory/gpu_used_gib"] <= r["memory/gpu_gib"]


def test_grpo_logs_device_memory_per_phase(tmp_path):
    run_grpo(grpo_config(tmp_path, max_steps=2, offload_optimizer=True))
    for r in metrics(tmp_path):
        for key in ("memory/generate_gib", "memory/train_gib", "memory/gpu_gib", "memory/gpu_used_gib"):
            assert r[key] == 0.0, key  # no device pool on the CPU


def test_grpo_is_reproducible(tmp_path):
    run_grpo(grpo_config(tmp_path / "a"))
    run_grpo(grpo_config(tmp_path / "b"))
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")


@pytest.mark.parametrize("loop", ["grpo", "sft"])
def test_resume_gives_the_same_next_steps(tmp_path, loop):
    def run(output_dir, max_steps, resume=None):
        if loop == "grpo":
            return run_grpo(grpo_config(output_dir, max_steps=max_steps, save_steps=2, resume_from_checkpoint=resume))
        cfg = SFTConfig(output_dir=str(output_dir), max_steps=max_steps, save_steps=2, learning_rate=1e-2,
                        per_device_train_batch_size=8, packing=False, seed=5, resume_from_checkpoint=resume,
                        lr_scheduler_type="constant")
        return train_sft(cfg, model=tiny_model(), tokenizer=make_tokenizer(), rows=SFT_ROWS, show_progress=False)

    full = run(tmp_path / "full", 4)
    run(tmp_path / "cut", 2)
    resumed = run(tmp_path / "cut", 4, resume="latest")
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "full")
    weights = [Model.from_pretrained(r.checkpoint).params.flat for r in (full, resumed)]
    np.testing.assert_array_equal(weights[0], weights[1])


@pytest.fixture
def model_folder(tmp_path):
    return write_model_folder(tmp_path)


def test_save_strategy_epoch_saves_after_each_pass_over_the_data(tmp_path):
    cfg = SFTConfig(output_dir=str(tmp_path), num_train_epochs=2, save_strategy="epoch", save_steps=1,
                    save_total_limit=None, per_device_train_batch_size=50, packing=False, seed=5)
    train_sft(cfg, model=tiny_model(), tokenizer=make_tokenizer(), rows=SFT_ROWS, show_progress=False)
    saved = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*"))
    assert saved == [2, 4]  # 100 rows, 50 a step: 2 steps a pass (save_steps does not apply)


def test_sft_on_a_hub_dataset_evaluates_on_its_test_split_as_trls_script(tmp_path, monkeypatch):
    splits = {"train": SFT_ROWS[:60], "test": SFT_ROWS[60:]}
    calls = stand_in_datasets(monkeypatch, splits)
    cfg = SFTConfig(output_dir=str(tmp_path / "hub"), dataset="org/sums", dataset_config="plain", max_steps=2,
                    eval_steps=1, per_device_train_batch_size=30, packing=False, save_strategy="no")
    result = train_sft(cfg, model=tiny_model(), tokenizer=make_tokenizer(), show_progress=False)
    assert calls == [("org/sums", "plain", "train"), ("org/sums", "plain", "test")]
    assert result.eval_loss is not None and all("eval_loss" in m for m in metrics(tmp_path / "hub"))
    with pytest.warns(UserWarning, match="eval_steps=1, but there is no evaluation data"):
        train_sft(dataclasses.replace(cfg, output_dir=str(tmp_path / "rows"), dataset=None), model=tiny_model(),
                  tokenizer=make_tokenizer(), rows=SFT_ROWS, show_progress=False)


def test_kill_9_then_resume_loses_only_the_steps_since_the_last_save(model_folder, tmp_path):
    folder, data = model_folder
    out = tmp_path / "run"
    args = ["sft", "--model", folder, "--dataset", data, "--output_dir", out, "--max_steps", 400, "--save_steps", 3,
            "--per_device_train_batch_size", 4, "--packing", "false", "--report_to", "jsonl"]
    proc = subprocess.Popen([sys.executable, "-m", "barerl.cli", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (out / "checkpoint-6").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert saved and saved[-1] >= 6
    logged = [r["step"] for r in read_jsonl(out / "metrics.jsonl")]
    result = cli(*args[:-6], "--max_steps", saved[-1] + 3, "--save_steps", 3, "--resume")
    assert result.returncode == 0, result.stderr
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl")]
    assert steps == list(range(1, saved[-1] + 4))  # the lost steps were run again, once each
    assert max(logged) - saved[-1] < 400  # only steps after the last save were lost
    shutil.rmtree(out)


def test_cli_errors_name_the_problem(model_folder, tmp_path):
    folder, data = model_folder
    bad = cli("sft", "--model", folder, "--dataset", data, "--max_stepz", 3)
    assert bad.returncode != 0 and "max_stepz" in bad.stderr
    missing = tmp_path / "nocol.jsonl"
    missing.write_text(json.dumps({"question": "1+1="}) + "\n")
    bad = cli("grpo", "--model", folder, "--dataset", missing, "--reward_funcs", "math_accuracy")
    assert bad.returncode == 1 and "prompt" in bad.stderr and "nocol.jsonl" in bad.stderr
    bad = cli("sft", "--model", tmp_path / "nowhere", "--dataset", data)
    assert bad.returncode == 1 and "nowhere" in bad.stderr
    bad = cli("grpo", "--model", folder, "--dataset", data, "--reward_funcs", "nosuchmodule:fn")
    assert bad.returncode == 1 and "nosuchmodule" in bad.stderr


@pytest.mark.parametrize("name", ["grpo_smollm2.yaml", "sft_chat.yaml"])
def test_example_configs_load(name):
    from barerl.train.config import load_config

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    cls = GRPOConfig if name.startswith("grpo") else SFTConfig
    cfg = load_config(cls, os.path.join(root, "examples", name))
    if cls is GRPOConfig:
        from barerl.train.data import load_dataset

        rows = load_dataset(os.path.join(root, cfg.dataset), task="grpo").rows
        assert len(rows) == 1000 and "answer" in rows[0]


def test_rewards_in_worker_processes_match_in_process_rewards(tmp_path):
    spec = f"{os.path.join(os.path.dirname(os.path.abspath(__file__)), 'train_helpers.py')}:starts_with_seven"
    for name, workers in (("thread", 0), ("workers", 1)):
        cfg = grpo_config(tmp_path / name, max_steps=2, reward_num_workers=workers, reward_timeout=120)
        train_grpo(cfg, model=tiny_model(), tokenizer=make_tokenizer(), rows=PROMPTS, reward_funcs=[spec],
                   show_progress=False, engine_args={"num_kv_blocks": 64})
    assert metrics(tmp_path / "thread") == metrics(tmp_path / "workers")


def test_demo_command_runs_end_to_end(tmp_path):
    """The README's main command, shortened: SFT, GRPO, before/after accuracy, checkpoint, plot."""
    result = cli("demo", "--output_dir", tmp_path, "--device", "cpu", "--sft_steps", 3, "--grpo_steps", 2)
    assert result.returncode == 0, result.stderr
    assert "held-out accuracy" in result.stdout and "after GRPO" in result.stdout
    assert (tmp_path / "grpo" / "checkpoint-2" / "model.safetensors").exists()


def test_eval_command_reports_accuracy(model_folder, tmp_path):
    folder, _ = model_folder
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(6)))
    result = cli("eval", "--model", folder, "--dataset", data, "--reward", "math_accuracy", "--max_tokens", 3)
    assert result.returncode == 0, result.stderr
    assert "accuracy" in result.stdout and "on 6 prompts" in result.stdout


def test_dynamic_sampling_fills_the_batch_with_informative_groups(tmp_path):
    result = run_grpo(grpo_config(tmp_path, max_steps=3, dynamic_sampling=True, dynamic_sampling_max_rounds=4,
                                  seed=4))
    records = metrics(tmp_path)
    assert len(result.rewards) == 3
    assert all("dynamic_sampling/rounds" in r for r in records)
    # a first round with uninformative groups is topped up by more rounds (seed 4: step 1 has none at all)
    assert all(r["dynamic_sampling/rounds"] >= 1 for r in records if r["frac_reward_zero_std"] > 0)
    assert records[0]["frac_reward_zero_std"] == 1.0 and records[0]["num_tokens"] > 0
