"""The memory plan (train/memory_plan.py, train/memory_check.py): hand-derived sizes on the Qwen3-0.6B shape of
workloads T1 and R1, the high-water marks measured for them on the H200, refusals and their suggestions, and
LoRA runs (the base frozen, the adapters trained)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from train_helpers import tiny_cfg

from barerl.config import ModelConfig
from barerl.train.config import GRPOConfig, SFTConfig
from barerl.train.memory_check import MemoryPlanError, check_plan, fitting_changes
from barerl.train.memory_plan import GIB, plan_training

# config.json of Qwen3-0.6B, -4B and -8B (random weights in the benchmarks; only the shapes matter here)
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "num_key_value_heads": 8, "head_dim": 128,
         "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 40960}
QWEN3_06B = ModelConfig.from_dict({**QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                                   "num_attention_heads": 16, "tie_word_embeddings": True})
QWEN3_8B = ModelConfig.from_dict({**QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                                  "num_attention_heads": 32, "tie_word_embeddings": False})
P = 596_049_920  # Qwen3-0.6B: 151,936 x 1,024 embedding (tied) + 28 x 15,730,944 per layer + 1,024 final norm
H200_ROOM = 139 * GIB  # what `nvidia-h200` machines give a run (143,771 MiB less the context and headroom)


def t1(**changes) -> SFTConfig:
    """T1: micro-batches of 16 sequences x 1,152 tokens, recomputation (bench/train_barerl.py --workload T1)."""
    return SFTConfig(per_device_train_batch_size=16, max_length=1152, max_tokens_per_microbatch=16 * 1152,
                     **{"gradient_checkpointing": True, **changes})


def r1(**changes) -> GRPOConfig:
    """R1: 8 prompts x 8 samples, 128 + 1,024 tokens, micro-batches of 16 (bench/grpo_barerl.py --workload R1)."""
    return GRPOConfig(num_generations=8, per_device_train_batch_size=16, gradient_accumulation_steps=4,
                      max_prompt_length=128, max_completion_length=1024, max_tokens_per_microbatch=16 * 1152,
                      **{"gradient_checkpointing": True, **changes})


def r3(**changes) -> GRPOConfig:
    """R3: Qwen3-8B, 8 prompts x 8 samples, 256 + 2,048 tokens, micro-batches of 4, no checkpoints."""
    return GRPOConfig(num_generations=8, per_device_train_batch_size=4, gradient_accumulation_steps=16,
                      max_prompt_length=256, max_completion_length=2048, max_tokens_per_microbatch=4 * 2304,
                      gradient_checkpointing=True, **{"save_strategy": "no", **changes})


def test_t1_by_hand():
    assert QWEN3_06B.num_parameters() == P
    plan = plan_training(QWEN3_06B, "bfloat16", t1())
    train = plan.phase("train")
    assert [p.name for p in plan.phases] == ["train"]
    assert train.get("weights (bfloat16)") == 2 * P
    assert train.get("gradients (fp32)") == 4 * P
    assert train.get("optimizer state") == 12 * P  # fp32 master and two moments, no decay mask
    tokens = 16 * 1152
    # per token and layer: the layer input x (1,024 bf16) and attention's o (16 x 128 bf16) and lse (16 fp32)
    assert train.get("activations kept for backward") == 28 * (2048 + 4096 + 64) * tokens
    # one layer's backward, per token: recomputed rmsnorm x2 (2 x (2048 + 4)), qkv (8192), x_mid (2048),
    # gate_up (12288), rotated qkv (8192) + q/k rstd (24 x 4), swiglu (6144); layer_backward's nine gradients
    # (3 x 3072 + 4 x 1024 + 2048 + 2 x 4096 elements, bf16); dq in fp32 (8192) and delta (64); dx, h, dh, x_final
    recomputed = 2 * 2052 + 8192 + 2048 + 12288 + 8192 + 96 + 6144
    assert train.get("one layer's backward or the LM head") == (recomputed + 2 * 23552 + 8256 + 8192) * tokens


def test_r1_by_hand_resident_and_offloaded():
    resident = plan_training(QWEN3_06B, "bfloat16", r1())
    generate = resident.phase("generate")
    # each prompt's 8 full blocks once, each sample's 65 (1,024 + 15 tokens over 16) of its own: 4,224 blocks,
    # of 16 tokens of 28 layers x 8 kv heads x 128 x (k, v) x 2 bytes
    assert generate.get("KV cache (4,224 blocks of 16)") == (8 * 8 + 64 * 65) * 16 * 114688
    assert generate.get("gradients (fp32)") == 4 * P  # allocated, zero, while the engine generates
    assert [p.name for p in resident.phases] == ["generate", "train"] and not resident.host

    offloaded = plan_training(QWEN3_06B, "bfloat16", r1(offload_optimizer=True, offload_optimizer_ratio=0.55))
    host = round(0.55 * P)
    # the master as its low 16 bits (bf16 weights, stochastic rounding rebuild the rest) and two moments
    assert offloaded.host[0].nbytes == 10 * host and offloaded.link_bytes == 10 * host
    assert offloaded.phase("train").get("optimizer state kept (45%)") == 10 * (P - host)
    assert offloaded.phase("train").get("streamed optimizer staging") == 2 * (1 << 24) * 10
    assert offloaded.phase("generate").get("gradients (fp32)") == 0  # freed while the engine generates
    # a checkpoint brings the whole state back (the gradients dropped) and offloads it again
    assert offloaded.phase("checkpoint").nbytes == 2 * P + 12 * P + 2 * P


# High-water marks on the H200, 2026-12-01 at 1ae8b82, 5065b97, 228f38b and 3418ccb (bench/RESULTS.md as of
# d5f8196): `bench_train_step.py` (CuPy's reserved pool) and `bench_grpo_step.py --batch-invariant off
# --num-scheduler-steps 16` (memory/generate_gib and memory/train_gib: the pool plus the engine's KV cache and
# graph pool), GiB; those scripts are now bench/train_barerl.py and bench/grpo_barerl.py.
MEASURED = [
    ("T1, keep attention", t1(), {"train": 14.7}),
    ("T1, keep attention,linear", t1(gradient_checkpointing_keep=("attention", "linear")), {"train": 25.1}),
    ("R1 --offload-optimizer", r1(offload_optimizer=True), {"generate": 8.6, "train": 8.3}),
    ("R1 --offload-optimizer 0.55", r1(offload_optimizer=True, offload_optimizer_ratio=0.55),
     {"generate": 11.1, "train": 10.6}),
    ("R1 --keep attention,linear", r1(gradient_checkpointing_keep=("attention", "linear")),
     {"generate": 17.4, "train": 25.2}),
]


@pytest.mark.parametrize("name,train,measured", MEASURED, ids=[m[0] for m in MEASURED])
def test_plans_match_the_peaks_measured_on_the_h200(name, train, measured):
    plan = plan_training(QWEN3_06B, "bfloat16", train)
    for phase, gib in measured.items():
        planned = plan.phase(phase).nbytes / GIB
        assert abs(planned - gib) <= 0.04 * gib, f"{name} {phase}: planned {planned:.2f} GiB, measured {gib}"


def test_r3_needs_the_optimizer_offloaded_and_is_told_the_smallest_share():
    """Qwen3-8B with its fp32 master and moments resident (98 GB) and the gradients (33 GB) needs more than
    an H200 in both phases; the refusal names the smallest offloaded share that fits, which does fit."""
    with pytest.raises(MemoryPlanError) as refused:
        check_plan(QWEN3_8B, "bfloat16", r3(), H200_ROOM)
    message = str(refused.value)
    assert "generate phase needs" in message and "--offload_optimizer true --offload_optimizer_ratio" in message
    flags, plan = next(fitting_changes(QWEN3_8B, "bfloat16", r3(), H200_ROOM))
    share = float(flags.split()[-1])
    assert flags in message and plan.peak.nbytes <= H200_ROOM
    # offloading frees the gradients while the engine generates and keeps the master as its low halves: a
    # small share is enough, and one step smaller does not fit
    assert 0 < share <= 0.1
    if share > 0.01:
        smaller = r3(offload_optimizer=True, offload_optimizer_ratio=round(share - 0.01, 2))
        assert plan_training(QWEN3_8B, "bfloat16", smaller).peak.nbytes > H200_ROOM
    check_plan(QWEN3_8B, "bfloat16", r3(offload_optimizer=True, offload_optimizer_ratio=share), H200_ROOM)


def test_a_checkpoint_of_an_offloaded_state_is_planned_and_can_be_declined():
    """Saving restores the whole state on the device: R3 fully offloaded fits while it trains, not while it saves."""
    offloaded = r3(offload_optimizer=True, save_strategy="steps")
    with pytest.raises(MemoryPlanError, match="checkpoint phase needs .*--save_strategy no"):
        check_plan(QWEN3_8B, "bfloat16", offloaded, 120 * GIB)
    check_plan(QWEN3_8B, "bfloat16", dataclasses.replace(offloaded, save_strategy="no"), 120 * GIB)


def test_sft_refusals_suggest_recomputation_and_smaller_micro_batches():
    plain = t1(gradient_checkpointing=False)
    room = plan_training(QWEN3_06B, "bfloat16", t1()).peak.nbytes + GIB // 2
    with pytest.raises(MemoryPlanError) as refused:
        check_plan(QWEN3_06B, "bfloat16", plain, room)
    assert "--gradient_checkpointing true" in str(refused.value)
    assert "--offload_optimizer" not in str(refused.value)  # a GRPO setting only
    keeping = t1(gradient_checkpointing_keep=("attention", "linear"))
    changes = [flags for flags, _ in fitting_changes(QWEN3_06B, "bfloat16", keeping, room)]
    assert changes[0] == "--gradient_checkpointing_keep attention"
    with pytest.raises(MemoryPlanError, match="No single setting makes it fit"):
        check_plan(QWEN3_06B, "bfloat16", keeping, 8 * GIB)


def test_grpo_refuses_before_loading_the_model(tmp_path, monkeypatch, capsys):
    """`barerl grpo` on a model whose plan does not fit stops before reading a weight: the folder has none."""
    from barerl import cli
    from barerl.train import memory_check

    model = tmp_path / "qwen3-8b-shape"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**QWEN3_8B.to_dict(), "architectures": ["Qwen3ForCausalLM"]}))
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(8)))
    monkeypatch.setattr(memory_check, "device_room", lambda: H200_ROOM)
    monkeypatch.setattr("barerl.device.resolve_device", lambda device: device)  # a GPU, as the room says
    monkeypatch.setattr("barerl.train.preflight.resolve_device", lambda device: device)
    monkeypatch.setattr("barerl.train.grpo.load_tokenizer", lambda path: object())
    code = cli.main(["grpo", "--model", str(model), "--dataset", str(data), "--reward_funcs", "format_tags",
                     "--device", "cuda", "--per_device_train_batch_size", "8", "--max_completion_length", "2048",
                     "--max_prompt_length", "256"])
    err = capsys.readouterr().err
    assert code == 1 and "error: memory plan: the train phase needs" in err, err
    assert "Settings that fit, one change each: --offload_optimizer true --offload_optimizer_ratio" in err


# LoRA r=16 on every linear layer of Qwen3-0.6B, per layer: A and B of q/k/v (48 x 1,024 and 4,096 x 48), of
# o_proj (16 x 2,048, 1,024 x 16), of gate/up (32 x 1,024, 6,144 x 32) and of down (16 x 3,072, 1,024 x 16),
# the block-diagonal B's zeros included (peft's modules hold 360,448 of these 589,824)
LORA_06B = 28 * (48 * 1024 + 4096 * 48 + 16 * 2048 + 1024 * 16 + 32 * 1024 + 6144 * 32 + 16 * 3072 + 1024 * 16)


def test_a_lora_run_plans_the_frozen_base_and_the_adapters_state_alone():
    full = plan_training(QWEN3_06B, "bfloat16", r1(beta=0.04))
    plan = plan_training(QWEN3_06B, "bfloat16", r1(beta=0.04, lora_r=16))
    assert "LoRA r=16 on all-linear (16.52 M adapter parameters" in plan.title
    for phase in ("generate", "train"):
        parts = plan.phase(phase)
        assert parts.get("weights (bfloat16)") == 2 * P and parts.get("LoRA adapters (bfloat16)") == 2 * LORA_06B
        assert parts.get("adapter gradients (fp32)") == 4 * LORA_06B  # the base gets none
        assert parts.get("adapter optimizer state") == 12 * LORA_06B  # fp32 master and moments of the adapters
        assert parts.get("gradients (fp32)") == parts.get("reference model (beta > 0)") == 0  # the base is the KL's
    assert full.phase("train").get("reference model (beta > 0)") == 2 * P
    saved = "activations kept for backward"
    assert plan.phase("train").get(saved) == full.phase("train").get(saved)
    # a layer's backward also holds an adapted product's input (dropped out) and the adapter path's dx, 3,072
    # wide at down, and u, du (48 wide at q/k/v), bf16
    work = "one layer's backward or the LM head"
    assert plan.phase("train").get(work) - full.phase("train").get(work) == (2 * 3072 + 2 * 48) * 2 * 16 * 1152
    offloaded = plan_training(QWEN3_06B, "bfloat16", r1(lora_r=16, offload_optimizer=True))
    assert offloaded.host[0].nbytes == 10 * LORA_06B and offloaded.link_bytes == 10 * LORA_06B


def test_a_full_parameter_refusal_offers_lora_where_it_fits():
    """R3 (Qwen3-8B) does not fit an H200 with every parameter trained; LoRA r=16 does, and is said (after the
    cheapest changes of how the same run is computed)."""
    with pytest.raises(MemoryPlanError) as refused:
        check_plan(QWEN3_8B, "bfloat16", r3(), H200_ROOM)
    assert "; --lora_r 16 (generate " in str(refused.value)
    check_plan(QWEN3_8B, "bfloat16", r3(lora_r=16), H200_ROOM)
    changes = [flags for flags, _ in fitting_changes(QWEN3_8B, "bfloat16", r3(lora_r=16), 30 * GIB)]
    assert changes and "--lora_r 16" not in changes  # a LoRA run is never told to use LoRA


def test_an_adapter_folder_as_the_model_is_planned_on_its_base(tmp_path, capsys):
    """plan_run reads the base's config through adapter_config.json and the adapter's rank and modules from it."""
    from barerl.model.checkpoint import save_checkpoint
    from barerl.model.lora import LoraConfig, add_lora
    from barerl.model.model import Model
    from barerl.model.peft_format import save_adapter
    from barerl.train.memory_check import plan_run

    model = Model.random(tiny_cfg())
    save_checkpoint(tmp_path / "base", model.cfg, model.params)
    save_adapter(tmp_path / "adapter", add_lora(model, LoraConfig(r=4, target_modules=("q_proj", "v_proj"))),
                 base_model=str(tmp_path / "base"))
    plan = plan_run(r1(model=str(tmp_path / "adapter"), device="cpu", dtype="bfloat16"))
    # 2 layers; q (16 rows) and v (8) of the fused q/k/v site (32 rows): A (8, 16), B (32, 8)
    assert plan.phase("train").get("adapter gradients (fp32)") == 4 * 2 * (8 * 16 + 32 * 8)
    assert "LoRA r=4 on q_proj,v_proj" in capsys.readouterr().out
