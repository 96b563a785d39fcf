"""LoRA in the training loops, on tiny models: SFT and GRPO learn with the base frozen and its gradient never
formed, the engine generates with the adapters the optimizer updates, checkpoints hold the adapter (PEFT
format) and its optimizer state alone, a resumed run takes the very same steps, a run starts from a PEFT
adapter, dropout masks survive recomputation; and on the GPU: the reference's numbers in fp32, the
engine/trainer mismatch of batch-invariant bf16, CUDA-graph decode equal to eager.

The tiny model's final norm is scaled up (`expressive`): with its random frozen embeddings (the tied head) and
unit norm weights, no hidden state gives any token more than ~12% of the probability, which caps what
adapters, which never touch the head, can learn there (peft's LoRA on it plateaus the same way)."""

import json
import math
import os

import numpy as np
import pytest
from train_helpers import (
    SFT_ROWS,
    cli,
    grpo_config,
    metrics,
    read_jsonl,
    run_grpo,
    smollm2_like_model,
    tiny_model,
)

from barerl.config import ConfigError
from barerl.formats.safetensors import read_safetensors
from barerl.model.batch import PackedBatch
from barerl.model.checkpoint import save_checkpoint
from barerl.model.lora import LoraConfig, add_lora
from barerl.model.peft_format import ADAPTER_CONFIG, ADAPTER_WEIGHTS, read_adapter
from barerl.ops import ref
from barerl.train.config import SFTConfig
from barerl.train.demo import make_tokenizer
from barerl.train.sft import train_sft
from barerl.train.state import OPTIMIZER_FILE, STATE_DIR

LORA = {"lora_r": 8, "lora_alpha": 16}


def expressive(model, norm: float = 5.0):
    model.params["model.norm.weight"][...] = norm
    return model


def sft(output_dir, max_steps, model=None, **kw):
    """LoRA SFT on SFT_ROWS of `model`: a Model, a path (cfg.model), or by default the expressive tiny one."""
    options = {"learning_rate": 1e-2, "per_device_train_batch_size": 16, "packing": False, "seed": 5,
               "lr_scheduler_type": "constant", "save_steps": 0, **LORA, **kw}
    path = str(model) if isinstance(model, (str, os.PathLike)) else None
    cfg = SFTConfig(output_dir=str(output_dir), max_steps=max_steps, model=path, **options)
    model = None if path else model or expressive(tiny_model())
    return train_sft(cfg, model=model, tokenizer=make_tokenizer(), rows=SFT_ROWS, show_progress=False)


def adapter_tensors(checkpoint) -> dict:
    return {k: np.array(v) for k, v in read_safetensors(os.path.join(checkpoint, ADAPTER_WEIGHTS)).items()}


def test_grpo_with_lora_raises_reward_with_the_base_frozen(tmp_path):
    model = expressive(tiny_model())
    base = model.params.flat.copy()
    result = run_grpo(grpo_config(tmp_path, max_steps=16, **LORA), model)
    first, last = np.mean(result.rewards[:2]), np.mean(result.rewards[-2:])
    assert last > max(0.5, first + 0.3), result.rewards
    np.testing.assert_array_equal(model.params.flat, base)
    assert max(r["mismatch/max"] for r in metrics(tmp_path)) < 1e-4  # the engine ran the trainer's adapters


def test_sft_with_lora_lowers_the_loss(tmp_path):
    sft(tmp_path, 40)
    losses = [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")]
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses


@pytest.mark.parametrize("loop", ["grpo", "sft"])
def test_lora_checkpoints_hold_the_adapter_and_resume_the_same_steps(tmp_path, loop):
    def run(output_dir, max_steps, resume=None):
        options = {"save_steps": 2, "resume_from_checkpoint": resume, "lora_dropout": 0.1, **LORA}
        if loop == "grpo":
            return run_grpo(grpo_config(output_dir, max_steps=max_steps, **options), expressive(tiny_model()))
        return sft(output_dir, max_steps, **options)

    full = run(tmp_path / "full", 4)
    run(tmp_path / "cut", 2)
    resumed = run(tmp_path / "cut", 4, resume="latest")
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "full")
    saved = [adapter_tensors(r.checkpoint) for r in (full, resumed)]
    assert saved[0].keys() == saved[1].keys() and all(np.array_equal(saved[0][k], saved[1][k]) for k in saved[0])
    files = set(os.listdir(full.checkpoint))
    assert {ADAPTER_CONFIG, ADAPTER_WEIGHTS, "tokenizer.json"} <= files and "model.safetensors" not in files
    optimizer = read_safetensors(os.path.join(full.checkpoint, STATE_DIR, OPTIMIZER_FILE))
    adapter_size = sum(a.size for a in saved[0].values())  # the stored blocks; the buffer adds B's zeros
    assert all(adapter_size <= a.size < 3 * adapter_size for a in optimizer.values())


def test_a_run_starts_from_a_peft_adapter(tmp_path):
    """As lora_adapter over the base, or as the model itself (its base named in adapter_config.json)."""
    base = tmp_path / "base"
    model = expressive(tiny_model())
    save_checkpoint(base, model.cfg, model.params, tokenizer=make_tokenizer())
    first = sft(tmp_path / "first", 3, model=base)
    trained = adapter_tensors(first.checkpoint)
    for name, start in (("adapter", {"model": base, "lora_adapter": first.checkpoint}),
                        ("as-model", {"model": first.checkpoint})):
        again = sft(tmp_path / name, 1, lora_r=0, learning_rate=0.0, **start)
        after = adapter_tensors(again.checkpoint)
        assert trained.keys() == after.keys() and all(np.array_equal(trained[k], after[k]) for k in trained)
        config = json.loads((tmp_path / name / "checkpoint-1" / ADAPTER_CONFIG).read_text())
        assert config["base_model_name_or_path"] == str(base.resolve()) and config["r"] == LORA["lora_r"]
    with pytest.raises(ValueError, match="lora_r=4.*r=8"):
        sft(tmp_path / "wrong", 1, model=base, lora_adapter=first.checkpoint, lora_r=4)


def test_rslora_runs_save_and_resume_their_scale(tmp_path):
    """use_rslora: adapters scaled by lora_alpha / sqrt(r), written to adapter_config.json and read back."""
    result = sft(tmp_path / "rs", 1, use_rslora=True)
    assert json.loads((tmp_path / "rs" / "checkpoint-1" / ADAPTER_CONFIG).read_text())["use_rslora"] is True
    lora, _ = read_adapter(result.checkpoint)
    assert lora.use_rslora and lora.scale == LORA["lora_alpha"] / math.sqrt(LORA["lora_r"])
    with pytest.raises(ConfigError, match="use_rslora"):
        LoraConfig(r=4, use_rslora="yes")


def test_a_model_with_adapters_trains_only_in_their_layout(tmp_path):
    model = tiny_model()
    add_lora(model, LoraConfig(r=4))
    with pytest.raises(ValueError, match="adapters already"):
        sft(tmp_path, 1, model=model)
    batch = PackedBatch.from_sequences([[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="adapters' layout"):
        model.forward_backward(batch, lambda lp, _: (0.0, lp * 0, {}), model.zeros_like_params())


def lora_gradients(model, batch, checkpoint, keep=("attention",), dropout_seed=7):
    mask = batch.loss_mask
    grads = model.lora.weights.with_flat(np.zeros_like(model.lora.weights.flat))
    model.forward_backward(batch, lambda lp, _: (float(-(lp * mask).sum()), -mask, {}), grads,
                           checkpoint=checkpoint, keep_ops=keep, dropout_seed=dropout_seed)
    return grads.flat


@pytest.mark.parametrize("keep", [("attention",), ("linear",)], ids=str)
def test_dropout_masks_survive_recomputation(keep):
    model = tiny_model()
    adapters = add_lora(model, LoraConfig(r=4, lora_dropout=0.3))
    adapters.weights.flat[...] = np.random.default_rng(0).normal(0, 0.1, adapters.weights.flat.shape)
    batch = PackedBatch.from_sequences([[1, 5, 7, 3, 9, 4], [2, 8, 6]])
    plain = lora_gradients(model, batch, checkpoint=False)
    np.testing.assert_array_equal(lora_gradients(model, batch, checkpoint=True, keep=keep), plain)
    assert not np.array_equal(lora_gradients(model, batch, checkpoint=False, dropout_seed=8), plain)
    adapters.config = LoraConfig(r=4)
    undropped = lora_gradients(model, batch, checkpoint=False)
    np.testing.assert_array_equal(lora_gradients(model, batch, checkpoint=False, dropout_seed=None), undropped)
    assert not np.array_equal(undropped, plain)


def test_dropout_keeps_one_minus_p_and_scales_what_it_keeps():
    x = np.random.default_rng(1).normal(size=(64, 256)).astype(np.float32)
    y = ref.dropout(x, 0.25, seed=3, stream=5)
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_array_equal(y[kept], x[kept] * np.float32(1 / 0.75))
    np.testing.assert_array_equal(ref.dropout_backward(x, 0.25, seed=3, stream=5), y)
    assert not np.array_equal(ref.dropout(x, 0.25, seed=3, stream=6) != 0, kept)


def test_demo_command_with_lora(tmp_path):
    result = cli("demo", "--output_dir", tmp_path, "--device", "cpu", "--sft_steps", 3, "--grpo_steps", 2,
                 "--lora_r", 4)
    assert result.returncode == 0, result.stderr
    assert "LoRA r=4" in result.stdout and "after GRPO" in result.stdout
    assert (tmp_path / "grpo" / "checkpoint-2" / ADAPTER_WEIGHTS).exists()


# ---------------------------------------------------------------------------------------------------------
# GPU


def lora_model(device: str, dtype: str, max_position_embeddings=64):
    """smollm2_like_model with adapters on every projection, B made nonzero (as after training)."""
    model = smollm2_like_model(device, dtype, max_position_embeddings=max_position_embeddings)
    adapters = add_lora(model, LoraConfig(r=16, lora_alpha=32), seed=1)
    host = np.random.default_rng(2).normal(0, 0.02, adapters.weights.flat.shape).astype(np.float32)
    for _, _, site in adapters.weights.with_flat(host).sites():
        site.clear_off_diagonal()
    adapters.weights.flat[...] = model.xp.asarray(host.astype(model.dtype))
    return model


@pytest.mark.gpu
def test_lora_grpo_steps_on_the_gpu_equal_the_reference_in_fp32(tmp_path):
    runs = {}
    for device in ("cpu", "cuda"):
        cfg = grpo_config(tmp_path / device, max_steps=2, device=device, dtype="float32", learning_rate=1e-3)
        run_grpo(cfg, lora_model(device, "float32"))
        runs[device] = metrics(tmp_path / device)
    for want, got in zip(runs["cpu"], runs["cuda"]):
        assert got["reward"] == want["reward"]
        for key in ("loss", "grad_norm", "entropy"):
            assert abs(got[key] - want[key]) <= 1e-4 * max(abs(want[key]), 1e-3), (key, got[key], want[key])


@pytest.mark.gpu
def test_lora_engine_and_trainer_agree_in_bf16_with_batch_invariant_kernels(tmp_path):
    cfg = grpo_config(tmp_path, max_steps=2, device="cuda", dtype="bfloat16", max_completion_length=120,
                      learning_rate=1e-3)
    run_grpo(cfg, lora_model("cuda", "bfloat16", max_position_embeddings=256))
    records = metrics(tmp_path)
    assert max(r["mismatch/max"] for r in records) < 1e-5, [r["mismatch/max"] for r in records]


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [1, 4])
def test_cuda_graph_decode_with_adapters_equals_eager(steps):
    from barerl.engine.llm import LLM
    from barerl.engine.sampling_params import SamplingParams

    model = lora_model("cuda", "bfloat16", max_position_embeddings=128)  # the engines' batch_invariant carries it
    prompts = [np.random.default_rng(n).integers(3, 15, n).tolist() for n in (3, 9, 17, 5)]
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=40, ignore_eos=True, logprobs=True)

    def generate(eager: bool):
        llm = LLM(model, max_num_seqs=8, num_kv_blocks=64, max_model_len=128, enforce_eager=eager,
                  num_scheduler_steps=steps, batch_invariant=True)
        return [o for r in llm.generate(prompts, params, use_tqdm=False) for o in r.outputs]

    eager, graphed = generate(True), generate(False)
    for e, g in zip(eager, graphed, strict=True):
        assert g.token_ids == e.token_ids
        np.testing.assert_allclose(g.logprobs, e.logprobs, atol=1e-5)
