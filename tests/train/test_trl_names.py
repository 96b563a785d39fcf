"""TRL GRPOConfig / SFTConfig / TrainingArguments names in barerl configs: renamed onto barerl's keys, moot with a notice, unsupported at
TRL's default only; in files, on the command line and through config_from_dict."""

import dataclasses
import warnings

import pytest

from barerl.config import ConfigError
from barerl.train.config import (
    GRPOConfig,
    SFTConfig,
    TrainConfig,
    build_argparser,
    config_from_dict,
    load_config,
)
from barerl.train.data import encode_prompt
from barerl.train.episode import ChatTokens
from barerl.train.trl_names import (
    GRPO_NAMES,
    MOOT,
    RENAMED,
    SFT_NAMES,
    TRAINING_ARGS_NAMES,
    TRL_GRPO_NAMES,
    TRL_GRPO_SCRIPT_NAMES,
    TRL_SCRIPT_NAMES,
    TRL_SFT_NAMES,
    UNSUPPORTED,
    TRLNameNotice,
    names_of,
)

# TRL 1.16's GRPOConfig names that barerl's GRPOConfig does not define (trl/trainer/grpo_config.py)
TRL_ONLY = ("model_init_kwargs", "trust_remote_code", "router_aux_loss_coef", "disable_dropout",
            "cast_lm_head_to_fp32", "remove_unused_columns", "num_generations_eval", "ds3_gather_for_generation",
            "pad_to_multiple_of", "generation_kwargs", "repetition_penalty", "cache_implementation", "use_vllm",
            "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex",
            "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
            "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
            "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
            "vespo_lambda_neg", "multi_objective_aggregation", "sync_ref_model", "ref_model_mixup_alpha",
            "ref_model_sync_steps", "entropy_coef", "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max",
            "entropy_coef_delta", "entropy_target", "max_tool_calling_iterations",
            "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
            "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "off_policy_mask_threshold",
            "use_bias_correction_kl", "log_completions", "log_multimodal", "num_completions_to_print",
            "log_unique_prompts", "log_completions_hub_repo", "use_transformers_continuous_batching",
            "transformers_continuous_batching_config", "use_transformers_paged", "vllm_importance_sampling_cap")
IMPLEMENTED = ("chat_template_kwargs", "delta", "top_entropy_quantile")  # TRL's names, now barerl fields
# transformers 5.17's TrainingArguments fields that barerl's TrainConfig does not define (training_args.py)
TRAINING_ARGS_ONLY = (
    "lr_scheduler_kwargs", "optim", "optim_args", "optim_target_modules", "average_tokens_across_devices",
    "label_smoothing_factor", "bf16", "fp16", "bf16_full_eval", "fp16_full_eval", "tf32",
    "gradient_checkpointing_kwargs", "torch_compile", "torch_compile_backend", "torch_compile_mode",
    "use_liger_kernel", "liger_kernel_config", "use_cache", "neftune_noise_alpha", "torch_empty_cache_steps",
    "auto_find_batch_size", "logging_strategy", "logging_first_step", "log_on_each_node", "logging_nan_inf_filter",
    "include_num_input_tokens_seen", "log_level", "log_level_replica", "disable_tqdm", "project",
    "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id", "eval_strategy", "eval_delay",
    "per_device_eval_batch_size", "prediction_loss_only", "eval_on_start", "eval_do_concat_batches",
    "eval_use_gather_object", "eval_accumulation_steps", "include_for_metrics", "batch_eval_metrics",
    "save_on_each_node", "enable_jit_checkpoint", "push_to_hub", "hub_token", "hub_private_repo", "hub_model_id",
    "hub_strategy", "hub_always_push", "hub_revision", "load_best_model_at_end", "metric_for_best_model",
    "greater_is_better", "ignore_data_skip", "restore_callback_states_from_checkpoint", "full_determinism",
    "data_seed", "use_cpu", "accelerator_config", "parallelism_config", "dataloader_drop_last",
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context", "dataloader_in_order", "remove_unused_columns", "label_names",
    "train_sampling_strategy", "length_column_name", "ddp_find_unused_parameters", "ddp_broadcast_buffers",
    "ddp_static_graph", "ddp_backend", "fsdp", "fsdp_config", "deepspeed", "debug", "skip_memory_metrics",
    "do_train", "do_eval", "do_predict", "local_rank")
# TRL 1.16's SFTConfig names that barerl's SFTConfig does not define (trl/trainer/sft_config.py)
TRL_SFT_ONLY = ("model_init_kwargs", "trust_remote_code", "router_aux_loss_coef", "chat_template_path",
                "dataset_kwargs", "dataset_num_proc", "eos_token", "truncation_mode", "packing_strategy",
                "padding_free", "pad_to_multiple_of", "eval_packing", "loss_type", "activation_offloading",
                "pad_token")

# TRL 1.16's `trl sft` / `trl grpo` script names beside the configs (trl/trainer/model_config.py: ModelConfig;
# trl/scripts/utils.py: ScriptArguments, DatasetMixtureConfig; trl/scripts/grpo.py: GRPOScriptArguments) that
# barerl's configs do not define; torch_dtype is ModelConfig's name before TRL 1.0
TRL_SCRIPT_ONLY = ("model_name_or_path", "model_revision", "torch_dtype", "attn_implementation", "use_peft",
                   "lora_target_parameters", "lora_modules_to_save", "lora_task_type", "use_dora", "load_in_8bit",
                   "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage",
                   "dataset_name", "dataset_streaming", "ignore_bias_buffers", "datasets", "streaming",
                   "test_split_size")
TRL_SCRIPT_FIELDS = ("dtype", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "use_rslora",
                     "dataset_config", "dataset_train_split", "dataset_test_split")

TRL_SCRIPT_YAML = """\
model_name_or_path: runs/base
model_revision: main
torch_dtype: bfloat16
attn_implementation: flash_attention_2
use_peft: true
lora_alpha: 64
lora_target_modules: [q_proj, v_proj]
lora_task_type: CAUSAL_LM
load_in_4bit: false
dataset_name: openai/gsm8k
dataset_config: main
dataset_train_split: train
dataset_test_split: test
test_split_size: 0.1
reward_model_name_or_path: null
reward_funcs: [accuracy_reward, think_format_reward]
"""

TRL_YAML = """\
model: Qwen/Qwen3-0.6B
dataset: data.jsonl
learning_rate: 1.0e-6
beta: 0.0
logging_steps: 5
use_vllm: true
vllm_mode: colocate
vllm_gpu_memory_utilization: 0.5
vllm_importance_sampling_correction: true
vllm_importance_sampling_mode: token_truncate
vllm_importance_sampling_clip_max: 2.0
max_tool_calling_iterations: 3
log_completions: true
num_completions_to_print: 4
pad_to_multiple_of: null
trust_remote_code: true
chat_template_kwargs: {enable_thinking: false}
delta: 1.5
top_entropy_quantile: 0.2
sapo_temperature_neg: 1.05
entropy_coef: 0.0
use_bias_correction_kl: true
sync_ref_model: false
"""


def _load(tmp_path, text, flags=()):
    path = tmp_path / "trl.yaml"
    path.write_text(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(GRPOConfig, path, list(flags))
    return cfg, [str(w.message) for w in caught if w.category is TRLNameNotice]


def test_the_table_covers_trls_names_barerl_lacks():
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert set(TRL_GRPO_NAMES) == set(TRL_ONLY)
    assert not fields & set(TRL_GRPO_NAMES) and set(IMPLEMENTED) <= fields
    assert {e.kind for e in TRL_GRPO_NAMES.values()} == {RENAMED, MOOT, UNSUPPORTED}


def test_the_tables_cover_training_arguments_and_sft_names_barerl_lacks():
    # remove_unused_columns is a TrainingArguments field that GRPOConfig overrides: each job's table has its own
    assert set(TRAINING_ARGS_NAMES) | {"remove_unused_columns"} == set(TRAINING_ARGS_ONLY)
    assert set(TRL_SFT_NAMES) - {"remove_unused_columns"} == set(TRL_SFT_ONLY)
    assert not {f.name for f in dataclasses.fields(TrainConfig)} & set(TRAINING_ARGS_ONLY)
    assert not {f.name for f in dataclasses.fields(SFTConfig)} & set(SFT_NAMES)
    assert not {f.name for f in dataclasses.fields(GRPOConfig)} & set(GRPO_NAMES)
    for table in (TRAINING_ARGS_NAMES, TRL_SFT_NAMES):
        assert {e.kind for e in table.values()} == {RENAMED, MOOT, UNSUPPORTED}


def test_the_script_tables_cover_trls_script_names_barerl_lacks():
    assert set(TRL_SCRIPT_NAMES) == set(TRL_SCRIPT_ONLY) and set(TRL_GRPO_SCRIPT_NAMES) == {"reward_model_name_or_path"}
    assert set(TRL_SCRIPT_FIELDS) <= {f.name for f in dataclasses.fields(SFTConfig)}
    assert set(TRL_SCRIPT_NAMES) <= set(SFT_NAMES) and set(TRL_GRPO_SCRIPT_NAMES) <= set(GRPO_NAMES) - set(SFT_NAMES)


def test_a_trl_script_config_loads(tmp_path):
    cfg, notices = _load(tmp_path, TRL_SCRIPT_YAML)
    assert (cfg.model, cfg.dataset, cfg.dtype, cfg.eval_split) == ("runs/base", "openai/gsm8k", "bfloat16", 0.1)
    assert (cfg.dataset_config, cfg.dataset_train_split, cfg.dataset_test_split) == ("main", "train", "test")
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules) == (16, 64.0, ("q_proj", "v_proj"))
    assert cfg.reward_funcs == ("accuracy_reward", "think_format_reward")
    noted = {n.split("TRL's ")[1].split(" ")[0] for n in notices}
    assert noted == {"model_name_or_path", "torch_dtype", "attn_implementation", "use_peft", "dataset_name",
                     "test_split_size"}
    cfg, _ = _load(tmp_path, TRL_SCRIPT_YAML + "lora_r: 8\n")
    assert cfg.lora_r == 8
    cfg, _ = _load(tmp_path, TRL_SCRIPT_YAML.replace("use_peft: true", "use_peft: false"))
    assert cfg.lora_r == 0  # TRL trains every parameter without use_peft


@pytest.mark.parametrize("line,match", [
    ("use_peft: false\nlora_r: 8", "TRL's use_peft means lora_r=0, but lora_r is given as 8"),
    ("load_in_4bit: true", "bitsandbytes"),
    ("use_dora: true", "DoRA"),
    ("model_revision: v2", "main revision"),
    ("datasets: [{path: a.jsonl}]", "no mixtures"),
])
def test_trl_script_settings_barerl_cannot_honour(tmp_path, line, match):
    with pytest.raises(ConfigError, match=match):
        _load(tmp_path, line + "\n")


def test_the_sft_script_names_load_in_sft_configs():
    with pytest.warns(TRLNameNotice) as record:
        cfg = config_from_dict(SFTConfig, {"model_name_or_path": "runs/base", "dataset_name": "chat.jsonl"})
    assert (cfg.model, cfg.dataset, len(record)) == ("runs/base", "chat.jsonl", 2)
    with pytest.raises(ConfigError, match="unknown key 'reward_model_name_or_path'"):
        config_from_dict(SFTConfig, {"reward_model_name_or_path": None})


def test_a_trl_config_loads_with_one_notice_per_renamed_or_moot_key(tmp_path):
    cfg, notices = _load(tmp_path, TRL_YAML)
    assert (cfg.importance_sampling_mode, cfg.importance_sampling_cap, cfg.importance_sampling_correction) == (
        "token_truncate", 2.0, True)
    assert cfg.max_turns == 4 and cfg.log_completions_steps == 5  # 3 tool rounds after the first turn; logging_steps
    assert cfg.chat_template_kwargs == {"enable_thinking": False}
    assert (cfg.delta, cfg.top_entropy_quantile) == (1.5, 0.2)
    noted = {n.split("TRL's ")[1].split(" ")[0] for n in notices}
    assert noted == {"use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_importance_sampling_correction",
                     "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
                     "max_tool_calling_iterations", "log_completions", "num_completions_to_print",
                     "pad_to_multiple_of", "trust_remote_code"}  # unsupported names at TRL's default: silent
    assert all(n.startswith(f"config file {tmp_path / 'trl.yaml'}: TRL's ") and "\n" not in n for n in notices)
    assert any("max_turns=4" in n for n in notices)


@pytest.mark.parametrize("key,value,field,expected", [
    ("vllm_importance_sampling_correction", "false", "importance_sampling_correction", False),
    ("vllm_importance_sampling_mode", "sequence_truncate", "importance_sampling_mode", "sequence_truncate"),
    ("vllm_importance_sampling_clip_max", "5", "importance_sampling_cap", 5.0),
    ("vllm_importance_sampling_cap", "1.5", "importance_sampling_cap", 1.5),
    ("max_tool_calling_iterations", "0", "max_turns", 1),
    ("log_completions", "false", "log_completions_steps", 0),
    ("disable_dropout", "true", "lora_dropout", 0.0),
    ("generation_kwargs", '{"temperature": 0.7, "top_k": 20}', "temperature", 0.7),
    ("model_init_kwargs", '{"torch_dtype": "bfloat16", "attn_implementation": "sdpa"}', "dtype", "bfloat16"),
])
def test_renamed_values_land_in_barerls_field(key, value, field, expected):
    with pytest.warns(TRLNameNotice, match=f"TRL's {key} is barerl's"):
        cfg = load_config(GRPOConfig, None, [f"--{key}", value])
    assert getattr(cfg, field) == expected


def test_a_renamed_key_and_its_barerl_key_disagreeing_in_one_place_are_refused(tmp_path):
    text = "vllm_importance_sampling_mode: token_mask\nimportance_sampling_mode: sequence_mask\n"
    with pytest.raises(ConfigError, match="TRL's vllm_importance_sampling_mode means importance_sampling_mode="
                                          "'token_mask', but importance_sampling_mode is given as 'sequence_mask'"):
        _load(tmp_path, text)
    cfg, _ = _load(tmp_path, "vllm_importance_sampling_mode: token_mask\n", ["--importance_sampling_mode",
                                                                               "token_truncate"])
    assert cfg.importance_sampling_mode == "token_truncate"  # the command line over the file
    cfg, _ = _load(tmp_path, "importance_sampling_mode: token_mask\n", ["--vllm_importance_sampling_mode",
                                                                          "token_truncate"])
    assert cfg.importance_sampling_mode == "token_truncate"


@pytest.mark.parametrize("key,value,match", [
    ("vllm_importance_sampling_clip_max", "None", "always has a cap"),
    ("generation_kwargs", '{"num_beams": 4}', r"generation_kwargs \['num_beams'\]"),
    ("model_init_kwargs", '{"revision": "main"}', r"model_init_kwargs \['revision'\]"),
])
def test_renamed_values_barerl_cannot_take(key, value, match):
    with pytest.raises(ConfigError, match=match):
        load_config(GRPOConfig, None, [f"--{key}", value])


def test_moot_names_are_accepted_at_any_ordinary_value():
    values = {"use_vllm": True, "vllm_mode": "colocate", "vllm_server_host": "10.0.0.1", "vllm_server_port": 9000,
              "vllm_enable_sleep_mode": True, "vllm_model_impl": "transformers", "cache_implementation": "static",
              "ds3_gather_for_generation": True, "pad_to_multiple_of": 64, "remove_unused_columns": True,
              "log_completions_hub_repo": "me/completions", "use_transformers_continuous_batching": True,
              "transformers_continuous_batching_config": {"max_batch_tokens": 256}, "log_multimodal": False,
              "vllm_max_model_length": 4096, "num_generations_eval": 4, "trust_remote_code": True}
    with pytest.warns(TRLNameNotice) as record:
        assert config_from_dict(GRPOConfig, values) == GRPOConfig()
    assert len(record) == len(values) and all("has no effect in barerl" in str(w.message) for w in record)


@pytest.mark.parametrize("flags,match", [
    (["--vllm_mode", "server", "--vllm_server_base_url", "http://localhost:8000"], "no separate generation server"),
    (["--vllm_server_base_url", "http://localhost:8000"], "never with a server"),
    (["--vllm_tensor_parallel_size", "2"], "data parallel processes"),
    (["--ds3_gather_for_generation", "false"], "no ZeRO-3"),
])
def test_moot_values_that_ask_for_what_barerl_does_not_do(flags, match):
    with pytest.raises(ConfigError, match=f"command line: .*{match}"):
        load_config(GRPOConfig, None, flags)


def test_unsupported_names_load_at_trls_default_silently():
    defaults = {name: TRL_GRPO_NAMES[name].default for name in names_of(UNSUPPORTED)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config_from_dict(GRPOConfig, defaults) == GRPOConfig()


@pytest.mark.parametrize("key,value,reason", [
    ("sapo_temperature_neg", "2.0", "loss_type 'sapo'"),
    ("vespo_k_pos", "1", "loss_type 'vespo'"),
    ("entropy_coef", "0.01", "no entropy bonus"),
    ("use_adaptive_entropy", "true", "no entropy bonus"),
    ("sync_ref_model", "true", "frozen"),
    ("off_policy_mask_threshold", "0.5", "off-policy sequence masking"),
    ("repetition_penalty", "1.1", "repetition penalty"),
    ("router_aux_loss_coef", "0.001", "MoE"),
    ("vllm_structured_outputs_regex", "[0-9]+", "constrained decoding"),
    ("vllm_importance_sampling_clip_min", "0.5", "from above only"),
    ("use_bias_correction_kl", "false", None),  # barerl's own KL term: accepted
])
def test_unsupported_names_refuse_other_values(key, value, reason):
    if reason is None:
        load_config(GRPOConfig, None, [f"--{key}", value, "--beta", "0.04"])
        return
    with pytest.raises(ConfigError, match=f"TRL's {key} is not supported by barerl .*{reason}"):
        load_config(GRPOConfig, None, [f"--{key}", value])


def test_bias_corrected_kl_is_refused_only_with_a_kl_term():
    load_config(GRPOConfig, None, ["--use_bias_correction_kl", "true"])  # beta 0: nothing to correct
    with pytest.raises(ConfigError, match="use_bias_correction_kl is not supported.*with beta > 0"):
        load_config(GRPOConfig, None, ["--use_bias_correction_kl", "--beta", "0.04"])


def test_trl_flags_are_accepted_but_not_listed_in_help():
    with pytest.warns(TRLNameNotice):
        cfg = load_config(GRPOConfig, None, ["--use_vllm", "--vllm_importance_sampling_cap=2.5",
                                             "--chat_template_kwargs", '{"enable_thinking": false}'])
    assert cfg.importance_sampling_cap == 2.5 and cfg.chat_template_kwargs == {"enable_thinking": False}
    assert "use_vllm" not in build_argparser(GRPOConfig).format_help()
    with pytest.raises(ConfigError, match="unknown key 'use_vlm'.*did you mean"):
        load_config(GRPOConfig, None, ["--use_vlm"])  # not a TRL name: an error as before
    with pytest.raises(ConfigError, match="vllm_server_port: expected int"):
        load_config(GRPOConfig, None, ["--vllm_server_port", "http"])


def test_chat_template_kwargs_reach_the_template(chat_tokenizer):
    chat_tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                                    "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}")
    prompt = [{"role": "user", "content": "2+2?"}]
    text = lambda ids: chat_tokenizer.decode(ids)
    assert text(encode_prompt(prompt, chat_tokenizer)) == "2+2?\n"
    assert text(encode_prompt(prompt, chat_tokenizer, None, {"enable_thinking": False})) == "2+2?\n<no-think>"
    tokens = ChatTokens(chat_tokenizer, template_kwargs={"enable_thinking": False})
    assert text(tokens.prompt(prompt, [])) == "2+2?\n<no-think>"


SFT_YAML = """\
model: Qwen/Qwen3-0.6B
dataset: data.jsonl
learning_rate: 2.0e-5
num_train_epochs: 1
per_device_train_batch_size: 4
gradient_accumulation_steps: 4
gradient_checkpointing: true
gradient_checkpointing_kwargs: {use_reentrant: false}
bf16: true
tf32: true
optim: adamw_torch
lr_scheduler_type: cosine
lr_scheduler_kwargs: {num_cycles: 0.5}
warmup_ratio: 0.03
logging_steps: 10
logging_strategy: steps
save_strategy: steps
save_steps: 200
eval_strategy: steps
per_device_eval_batch_size: 16
report_to: none
seed: 42
data_seed: 42
push_to_hub: false
dataloader_num_workers: 4
ddp_find_unused_parameters: false
max_length: 2048
packing: true
packing_strategy: bfd
padding_free: true
assistant_only_loss: true
dataset_num_proc: 8
model_init_kwargs: {torch_dtype: bfloat16, attn_implementation: flash_attention_2}
use_liger_kernel: true
neftune_noise_alpha: null
"""


def _load_sft(tmp_path, text, cls=SFTConfig):
    path = tmp_path / "sft.yaml"
    path.write_text(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(cls, path)
    return cfg, {str(w.message).split("TRL's ")[1].split(" ")[0]: str(w.message) for w in caught
                 if w.category is TRLNameNotice}


def test_a_trl_sft_config_loads_with_training_arguments_keys(tmp_path):
    cfg, notices = _load_sft(tmp_path, SFT_YAML)
    assert (cfg.dtype, cfg.eval_steps, cfg.gradient_checkpointing, cfg.report_to) == ("bfloat16", 10, True, ("none",))
    assert (cfg.max_length, cfg.packing, cfg.assistant_only_loss, cfg.warmup_ratio) == (2048, True, True, 0.03)
    assert set(notices) == {"gradient_checkpointing_kwargs", "bf16", "tf32", "optim", "logging_strategy",
                            "eval_strategy", "per_device_eval_batch_size", "dataloader_num_workers",
                            "ddp_find_unused_parameters", "packing_strategy", "padding_free", "dataset_num_proc",
                            "model_init_kwargs", "use_liger_kernel"}  # unsupported names at TRL's default: silent
    assert "dtype='bfloat16'" in notices["bf16"] and "eval_steps=10" in notices["eval_strategy"]
    assert "torch.utils.checkpoint" in notices["gradient_checkpointing_kwargs"]


def test_a_trl_grpo_config_loads_with_training_arguments_keys(tmp_path):
    text = TRL_YAML + ("bf16: true\nfp16: false\noptim: adamw_torch_fused\nsave_strategy: steps\nreport_to: "
                       "[tensorboard]\ngradient_checkpointing_kwargs: {use_reentrant: false}\nlog_level: info\n"
                       "remove_unused_columns: false\npush_to_hub: false\nhub_model_id: null\n")
    cfg, notices = _load(tmp_path, text)
    assert (cfg.dtype, cfg.save_strategy, cfg.report_to) == ("bfloat16", "steps", ("tensorboard",))
    noted = {n.split("TRL's ")[1].split(" ")[0] for n in notices}
    assert {"bf16", "fp16", "optim", "gradient_checkpointing_kwargs", "log_level", "remove_unused_columns"} <= noted
    assert "push_to_hub" not in noted


@pytest.mark.parametrize("flags,dtype", [
    (["--bf16"], "bfloat16"), (["--bf16", "false"], "float32"), (["--fp16"], "float16"),
    (["--bf16", "false", "--fp16", "true"], "float16"), (["--fp16", "false"], "auto"),
])
def test_bf16_and_fp16_choose_the_dtype(flags, dtype):
    with pytest.warns(TRLNameNotice, match="is barerl's dtype"):
        assert load_config(SFTConfig, None, flags).dtype == dtype


def test_use_cpu_and_the_dtype_given_twice():
    with pytest.warns(TRLNameNotice):
        assert load_config(GRPOConfig, None, ["--use_cpu"]).device == "cpu"
    with pytest.raises(ConfigError, match="bf16 and fp16 are both true"):
        load_config(SFTConfig, None, ["--bf16", "--fp16"])
    with pytest.raises(ConfigError, match="TRL's bf16 means dtype='bfloat16', but dtype is given as 'float32'"), \
            pytest.warns(TRLNameNotice):
        config_from_dict(SFTConfig, {"bf16": True, "dtype": "float32"})


def test_unsupported_training_arguments_and_sft_names_load_at_trls_default_silently():
    for cls, table in ((SFTConfig, SFT_NAMES), (GRPOConfig, GRPO_NAMES)):
        defaults = {name: table[name].default for name in names_of(UNSUPPORTED, table)}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert config_from_dict(cls, defaults) == cls()


@pytest.mark.parametrize("cls,key,value,match", [
    (SFTConfig, "deepspeed", "ds_zero3.json", "no DeepSpeed: several GPUs run as barerl's own data-parallel"),
    (SFTConfig, "fsdp", "full_shard auto_wrap", "no FSDP: .*mpirun -n N"),
    (GRPOConfig, "push_to_hub", "true", "uploads nothing"),
    (SFTConfig, "hub_model_id", "me/model", "uploads nothing"),
    (SFTConfig, "neftune_noise_alpha", "5", "NEFTune"),
    (SFTConfig, "lr_scheduler_kwargs", '{"min_lr": 1e-6}', "take no options"),
    (SFTConfig, "data_seed", "7", "data_seed: None or the seed"),
    (SFTConfig, "load_best_model_at_end", "true", "no best model"),
    (SFTConfig, "activation_offloading", "true", "activations stay on the GPU"),
    (SFTConfig, "loss_type", "dft", "no DFT"),
    (SFTConfig, "chat_template_path", "template.jinja", "own chat template"),
    (SFTConfig, "eos_token", "<|im_end|>", "tokenizer's eos token"),
    (SFTConfig, "train_sampling_strategy", "group_by_length", "shuffle_dataset"),
])
def test_unsupported_values_are_refused_with_what_barerl_does(cls, key, value, match):
    with pytest.raises(ConfigError, match=f"TRL's {key} is not supported by barerl .*{match}"):
        load_config(cls, None, [f"--{key}", value])


@pytest.mark.parametrize("cls,flags,match", [
    (SFTConfig, ["--optim", "adamw_8bit"], "its own AdamW"),
    (GRPOConfig, ["--logging_strategy", "epoch"], "every logging_steps"),
    (SFTConfig, ["--eval_strategy", "epoch"], "set eval_steps"),
    (SFTConfig, ["--packing_strategy", "wrapped"], "never split"),
])
def test_training_arguments_values_barerl_cannot_honour(cls, flags, match):
    with pytest.raises(ConfigError, match=f"command line: .*{match}"):
        load_config(cls, None, flags)


def test_sft_names_are_not_grpo_names():
    with pytest.raises(ConfigError, match="unknown key 'packing_strategy' for GRPOConfig"):
        load_config(GRPOConfig, None, ["--packing_strategy", "bfd"])
    with pytest.warns(TRLNameNotice) as record:
        cfg = config_from_dict(SFTConfig, {"remove_unused_columns": True, "pad_token": "<pad>",
                                           "eval_strategy": "no", "eval_steps": 50, "save_strategy": "no"})
    assert (cfg.eval_steps, cfg.save_strategy, len(record)) == (50, "no", 3)
    with pytest.raises(ConfigError, match=r"save_strategy: must be one of \['steps', 'epoch', 'no'\], got 'best'"):
        load_config(SFTConfig, None, ["--save_strategy", "best"])  # barerl's own field: its choices
