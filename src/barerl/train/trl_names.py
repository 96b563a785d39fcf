"""TRL's config names that barerl's configs do not define, so that a TRL config carries over.

Every name of TRL 1.16's GRPOConfig and SFTConfig, of the `transformers.TrainingArguments` (5.17) they
subclass, and of the dataclasses TRL's `trl sft` / `trl grpo` scripts read from the same YAML file beside them
(ModelConfig, ScriptArguments, DatasetMixtureConfig, GRPOScriptArguments), is either a field of barerl's config
(same name, same meaning) or an entry of one of the tables here: TRAINING_ARGS_NAMES (for both jobs),
TRL_SFT_NAMES (SFTConfig's own), TRL_GRPO_NAMES (GRPOConfig's own), TRL_SCRIPT_NAMES (both scripts'),
TRL_GRPO_SCRIPT_NAMES (grpo's); `SFT_NAMES` and `GRPO_NAMES` are what each job accepts. Each entry is of one
of three kinds:
- RENAMED: the setting exists in barerl under another name or form; the value is taken, with a notice
  naming barerl's key (`vllm_importance_sampling_mode` -> `importance_sampling_mode`).
- MOOT: a setting of machinery barerl does not have (a separate vLLM, DeepSpeed, padding); accepted, with a
  notice saying why it changes nothing. A value that asks for something barerl does not do (a vLLM server,
  tensor parallelism) is a ConfigError saying what barerl does instead.
- UNSUPPORTED: a feature barerl lacks (SAPO, entropy bonus, ...). TRL's default is accepted silently, so a
  config that copies TRL's defaults loads; any other value is a ConfigError naming the feature.

The table is data: `GRPOConfig`'s loading (train/config.py) coerces a value to the entry's type, then
`resolve` turns it into barerl values and a notice, or an error; the loader warns each notice as a
`TRLNameNotice` (one line). Conversions also see the TRL names given (`bf16` reads `fp16`). Where a TRL key and barerl's key it maps onto are given in the same place
with different values, the loader refuses both; a later place (the command line over the file) wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from barerl.config import ConfigError

RENAMED, MOOT, UNSUPPORTED = "renamed", "moot", "unsupported"

# the config as given so far: explicit values over the defaults, barerl's and (coerced) TRL's names alike
Values = Mapping[str, Any]


class TRLNameNotice(UserWarning):
    """A TRL config key was taken under barerl's name, or accepted without effect."""


@dataclass(frozen=True)
class TRLName:
    kind: str  # RENAMED, MOOT or UNSUPPORTED
    tp: Any  # the type of TRL's field, as barerl's coercion reads it
    default: Any  # TRL's default; bool defaults make bare `--name` flags mean true
    why: str  # renamed: barerl's key; moot: why it has no effect; unsupported: what barerl lacks / offers
    # renamed: (value, config) -> barerl values (None: `why` names the one barerl key that takes the value)
    convert: Callable[[Any, Values], dict] | None = None
    # moot: (value, config) -> None, or the error for a value barerl cannot honour;
    # unsupported: (value, config) -> whether the value is accepted (None: TRL's default alone)
    check: Callable[[Any, Values], Any] | None = None


def renamed(target: str, tp, default, convert=None) -> TRLName:
    return TRLName(RENAMED, tp, default, target, convert)


def moot(why: str, tp, default, refuses=None) -> TRLName:
    return TRLName(MOOT, tp, default, why, check=refuses)


def unsupported(why: str, tp, default, accepts=None) -> TRLName:
    return TRLName(UNSUPPORTED, tp, default, why, check=accepts)


# ---------------------------------------------------------------------------------------------------------
# Conversions and refusals that need more than a rename


def _max_turns(value, config: Values) -> dict:
    if value is None:  # TRL: no limit but max_completion_length; barerl's episodes always have one
        return {}
    return {"max_turns": value + 1}  # TRL counts tool-calling rounds after the first model turn


def _log_completions_steps(value, config: Values) -> dict:
    return {"log_completions_steps": config["logging_steps"] if value else 0}  # TRL logs every logging_steps


def _no_dropout(value, config: Values) -> dict:
    return {"lora_dropout": 0.0} if value else {}  # LoRA's dropout is the only dropout barerl's model has


def _no_cap(value, config: Values) -> dict:
    if value is None:
        raise ConfigError("vllm_importance_sampling_clip_max=None: barerl's correction always has a cap "
                          "(importance_sampling_cap); turn it off with importance_sampling_correction: false")
    return {"importance_sampling_cap": value}


def _deprecated_cap(value, config: Values) -> dict:
    return {} if value is None else {"importance_sampling_cap": value}


_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")


def _generation_kwargs(value, config: Values) -> dict:
    other = sorted(set(value or {}) - set(_SAMPLING_KEYS))
    if other:  # the trainer's log-probs must come from the distribution the engine samples from
        raise ConfigError(f"generation_kwargs {other}: barerl's engine samples with {', '.join(_SAMPLING_KEYS)} "
                          "(the trainer's log-probs use the same distribution) and takes no other generation "
                          "options; set those keys at the top level")
    return dict(value or {})


_MODEL_KWARGS_MOOT = ("attn_implementation", "device_map", "use_cache", "low_cpu_mem_usage", "trust_remote_code")


def _model_init_kwargs(value, config: Values) -> dict:
    value = dict(value or {})
    dtypes = {value.pop(k) for k in ("dtype", "torch_dtype") if k in value}
    other = sorted(set(value) - set(_MODEL_KWARGS_MOOT))
    if other or len(dtypes) > 1:
        raise ConfigError(f"model_init_kwargs {other or ['dtype', 'torch_dtype']}: barerl loads `model` itself and "
                          "takes only dtype / torch_dtype from here (as its `dtype`); attention, devices and "
                          "caching are its own")
    return {"dtype": dtypes.pop()} if dtypes else {}


def _refuse_server(value, config: Values) -> str | None:
    if value != "colocate":
        return (f"vllm_mode={value!r}: barerl's engine runs inside the trainer on its GPU, sharing its weights "
                "(TRL's colocate); there is no separate generation server")
    return None


def _refuse_url(value, config: Values) -> str | None:
    if value is not None:
        return "vllm_server_base_url: barerl generates with its built-in engine, never with a server"
    return None


def _refuse_tensor_parallel(value, config: Values) -> str | None:
    if value != 1:
        return (f"vllm_tensor_parallel_size={value}: barerl's engine holds a whole model copy per process; "
                "several GPUs run as data parallel processes (mpirun -n N barerl grpo ...)")
    return None


def _refuse_ds3(value, config: Values) -> str | None:
    if not value:
        return ("ds3_gather_for_generation=false: barerl keeps whole working weights on every GPU (there is no "
                "ZeRO-3; zero_stage 1 shards the optimizer state only), so it cannot train a model past one GPU")
    return None


_NO_SERVER = "barerl has no vLLM server (its engine is built in): used only with vllm_mode='server'"
_ENGINE = "barerl generates with its own engine (continuous batching, paged KV cache), not transformers'"
_REF_FROZEN = "the reference model is frozen (with LoRA: the base itself); there is no TR-DPO sync"
_SAPO = "loss_type 'sapo' is not implemented (barerl has grpo, dr_grpo, dapo, bnpo)"
_VESPO = "loss_type 'vespo' is not implemented (barerl has grpo, dr_grpo, dapo, bnpo)"
_ENTROPY = "there is no entropy bonus in barerl's loss (the entropy is logged as `entropy`)"


TRL_GRPO_NAMES: dict[str, TRLName] = {
    # RENAMED: the value lands in barerl's key
    "vllm_importance_sampling_correction": renamed("importance_sampling_correction", bool, True),
    "vllm_importance_sampling_mode": renamed("importance_sampling_mode", str, "sequence_mask"),
    "vllm_importance_sampling_clip_max": renamed("importance_sampling_cap", float | None, 3.0, _no_cap),
    "vllm_importance_sampling_cap": renamed("importance_sampling_cap", float | None, None, _deprecated_cap),
    "max_tool_calling_iterations": renamed("max_turns (= max_tool_calling_iterations + 1)", int | None, None,
                                           _max_turns),
    "log_completions": renamed("log_completions_steps (true: every logging_steps; false: 0)", bool, False,
                               _log_completions_steps),
    "disable_dropout": renamed("lora_dropout (true: 0.0; the model has no other dropout)", bool, False,
                               _no_dropout),
    "generation_kwargs": renamed("temperature / top_p / top_k / min_p", dict | None, None, _generation_kwargs),
    "model_init_kwargs": renamed("dtype (from dtype / torch_dtype)", dict | None, None, _model_init_kwargs),
    # MOOT: TRL's machinery that barerl does not have
    "use_vllm": moot("barerl's engine is built in and shares the trainer's weights", bool, False),
    "vllm_mode": moot("barerl's engine is always colocated, sharing the trainer's weights", str, "colocate",
                      _refuse_server),
    "vllm_model_impl": moot("barerl's engine runs barerl's own model code", str, "vllm"),
    "vllm_enable_sleep_mode": moot("barerl frees the rollouts' KV cache while training and maps it again to "
                                   "generate, every step (the weights are shared, never offloaded)", bool, False),
    "vllm_server_base_url": moot(_NO_SERVER, str | None, None, _refuse_url),
    "vllm_server_host": moot(_NO_SERVER, str, "0.0.0.0"),
    "vllm_server_port": moot(_NO_SERVER, int, 8000),
    "vllm_server_timeout": moot(_NO_SERVER, float, 240.0),
    "vllm_group_port": moot(_NO_SERVER, int, 51216),
    "vllm_gpu_memory_utilization": moot("barerl sizes the rollouts' KV cache from the generation batch (the memory "
                                        "plan printed at start) and frees it while training", float, 0.3),
    "vllm_max_model_length": moot("the engine's length is max_prompt_length + max_completion_length", int | None,
                                  None),
    "vllm_tensor_parallel_size": moot("barerl's engine holds a whole model per process", int, 1,
                                      _refuse_tensor_parallel),
    "ds3_gather_for_generation": moot("there is no DeepSpeed: every GPU holds whole working weights, which the "
                                      "engine reads", bool, True, _refuse_ds3),
    "cache_implementation": moot("the engine's paged KV cache is the only one", str | None, None),
    "use_transformers_continuous_batching": moot(_ENGINE, bool, False),
    "transformers_continuous_batching_config": moot(_ENGINE, dict | None, None),
    "use_transformers_paged": moot(_ENGINE, bool, False),
    "trust_remote_code": moot("barerl runs no model code from the Hub: it implements each architecture itself",
                              bool, False),
    "remove_unused_columns": moot("barerl passes every dataset column to the reward functions", bool | None,
                                  False),
    "pad_to_multiple_of": moot("barerl packs sequences, it never pads", str | None, "auto"),
    "num_generations_eval": moot("barerl grpo runs no evaluation while training; `barerl eval --n N` samples N per "
                                 "prompt", int | None, None),
    "num_completions_to_print": moot("barerl prints no completions; samples.jsonl gets every completion of each "
                                     "logged step (log_completions_steps)", int | None, None),
    "log_unique_prompts": moot("samples.jsonl has one line per completion, with its prompt", bool, False),
    "log_multimodal": moot("barerl trains on text only: there is no multimodal content to log", bool, True),
    "log_completions_hub_repo": moot("barerl uploads nothing: samples stay in output_dir/samples.jsonl",
                                     str | None, None),
    # UNSUPPORTED: accepted at TRL's default alone
    "router_aux_loss_coef": unsupported("barerl trains dense models (Qwen3, Qwen2, Llama): no MoE router",
                                        float | None, None),
    "cast_lm_head_to_fp32": unsupported("the LM head's weights stay in the working dtype (its logits and "
                                        "log-probs are fp32, and batch_invariant makes the engine's and the "
                                        "trainer's agree); dtype: float32 trains all in fp32", bool, False),
    "repetition_penalty": unsupported("the engine's sampling has no repetition penalty", float, 1.0),
    "vllm_structured_outputs_regex": unsupported("the engine has no constrained decoding", str | None, None),
    "sapo_temperature_neg": unsupported(_SAPO, float, 1.05),
    "sapo_temperature_pos": unsupported(_SAPO, float, 1.0),
    "vespo_k_pos": unsupported(_VESPO, float, 2.0),
    "vespo_lambda_pos": unsupported(_VESPO, float, 3.0),
    "vespo_k_neg": unsupported(_VESPO, float, 3.0),
    "vespo_lambda_neg": unsupported(_VESPO, float, 2.0),
    "multi_objective_aggregation": unsupported("barerl sums the weighted rewards, then normalises (TRL's "
                                               "default)", str, "sum_then_normalize"),
    "sync_ref_model": unsupported(_REF_FROZEN, bool, False),
    "ref_model_mixup_alpha": unsupported(_REF_FROZEN, float, 0.6),
    "ref_model_sync_steps": unsupported(_REF_FROZEN, int, 512),
    "entropy_coef": unsupported(_ENTROPY, float, 0.0),
    "use_adaptive_entropy": unsupported(_ENTROPY, bool, False),
    "entropy_coef_min": unsupported(_ENTROPY, float, 0.0),
    "entropy_coef_max": unsupported(_ENTROPY, float, 1.0),
    "entropy_coef_delta": unsupported(_ENTROPY, float, 0.005),
    "entropy_target": unsupported(_ENTROPY, float, 0.2),
    "vllm_importance_sampling_clip_min": unsupported("the correction caps ratios from above only "
                                                     "(importance_sampling_cap)", float | None, None),
    "off_policy_mask_threshold": unsupported("there is no off-policy sequence masking (DeepSeek-V3.2)",
                                             float | None, None),
    # TRL multiplies the KL term by the ratio by default; barerl's KL term is TRL's false. The two agree
    # without a KL term, so TRL's default is refused only with beta > 0, where it would change the gradient.
    "use_bias_correction_kl": unsupported("with beta > 0 barerl's KL term is not multiplied by the importance "
                                          "ratio: it is TRL's use_bias_correction_kl=false (set that)", bool, True,
                                          lambda value, config: not value or config["beta"] == 0.0),
}


# ---------------------------------------------------------------------------------------------------------
# transformers.TrainingArguments (TRL's configs subclass it; TRL's defaults where TRL overrides them)


def _bf16(value, config: Values) -> dict:
    if value and config["fp16"]:
        raise ConfigError("bf16 and fp16 are both true: set at most one (they choose barerl's dtype)")
    if value is None:  # TRL: bf16 unless fp16; barerl's dtype auto is bfloat16 on cuda
        return {}
    return {"dtype": "bfloat16" if value else "float16" if config["fp16"] else "float32"}


def _fp16(value, config: Values) -> dict:
    return {"dtype": "float16"} if value else {}


def _use_cpu(value, config: Values) -> dict:
    return {"device": "cpu"} if value else {}


def _eval_strategy(value, config: Values) -> dict:
    if value == "steps":  # transformers: eval_steps, else logging_steps
        return {"eval_steps": config["eval_steps"] or config["logging_steps"]}
    if value == "no":
        return {}
    raise ConfigError(f"eval_strategy={value!r}: barerl's SFT evaluates every eval_steps steps and at the end; "
                      "set eval_steps")


def _refuse_logging(value, config: Values) -> str | None:
    if value != "steps":
        return f"logging_strategy={value!r}: barerl logs every logging_steps steps (and the last)"
    return None


_ADAMW = ("adamw_torch", "adamw_torch_fused")


def _refuse_optimizer(value, config: Values) -> str | None:
    if value not in _ADAMW:
        return (f"optim={value!r}: barerl's optimizer is its own AdamW (adam_beta1, adam_beta2, adam_epsilon, "
                "weight_decay; fp32 master weights and moments); there is no other")
    return None


def _off(value, config: Values) -> bool:  # None or empty (a command line's none / false too)
    return not value or (isinstance(value, str) and value.strip().lower() in ("none", "null", "false"))


def _scheduler_kwargs(value, config: Values) -> bool:
    return not value or (value == {"num_cycles": 0.5} and config["lr_scheduler_type"] == "cosine")


def _data_seed(value, config: Values) -> bool:
    return value is None or value == config["seed"]


def _sampling(value, config: Values) -> bool:
    return value == "random" or (value == "sequential" and not config.get("shuffle_dataset", True))


_TORCH = "barerl runs its own kernels, without PyTorch"
_LOGGING = "barerl's messages have no logging levels"
_TRACKIO = "barerl does not report to Trackio (report_to: jsonl, tensorboard, wandb)"
_EVAL_LOSS = "barerl's evaluation (SFT) computes eval_loss alone"
_NO_DATALOADER = "barerl has no DataLoader: it tokenizes the dataset up front and builds each batch from memory"
_DDP = ("barerl's data parallelism is its own (one process per GPU under mpirun / srun, barerl.distributed), "
        "not torch DDP")
_HUB = "barerl uploads nothing: checkpoints stay in output_dir"
_BEST = "barerl keeps the last save_total_limit checkpoints and tracks no best model"
_PARALLEL = ("several GPUs run as barerl's own data-parallel processes (mpirun -n N barerl sft|grpo ...), each "
             "with whole weights; zero_stage 1 shards the optimizer state")

TRAINING_ARGS_NAMES: dict[str, TRLName] = {
    # RENAMED
    "bf16": renamed("dtype (true: bfloat16; false: float32, or float16 with fp16)", bool | None, None, _bf16),
    "fp16": renamed("dtype (true: float16)", bool, False, _fp16),
    "use_cpu": renamed("device (true: cpu)", bool, False, _use_cpu),
    "eval_strategy": renamed("eval_steps (steps: eval_steps, else logging_steps; no: eval_steps decides)", str,
                             "no", _eval_strategy),
    # MOOT
    "optim": moot("barerl's AdamW is its own, one fused update per step (torch's AdamW's arithmetic)", str,
                  "adamw_torch_fused", _refuse_optimizer),
    "gradient_checkpointing_kwargs": moot("barerl recomputes in its own backward (gradient_checkpointing_keep "
                                          "chooses what is kept), not with torch.utils.checkpoint", dict | None,
                                          None),
    "tf32": moot("barerl has no TF32 switch: its products run in its dtype (bfloat16 on cuda by default)",
                 bool | None, None),
    "torch_compile": moot(_TORCH, bool, False),
    "torch_compile_backend": moot(_TORCH, str | None, None),
    "torch_compile_mode": moot(_TORCH, str | None, None),
    "use_liger_kernel": moot("barerl's kernels are its own (the LM head and its loss run fused, in chunks)", bool,
                             False),
    "liger_kernel_config": moot("barerl's kernels are its own", dict | None, None),
    "use_cache": moot("training passes keep no KV cache (the engine's is its own)", bool, False),
    "torch_empty_cache_steps": moot("barerl does not use torch's caching allocator", int | None, None),
    "logging_strategy": moot("barerl logs every logging_steps steps", str, "steps", _refuse_logging),
    "log_on_each_node": moot(_LOGGING, bool, True),
    "log_level": moot(_LOGGING, str, "passive"),
    "log_level_replica": moot(_LOGGING, str, "warning"),
    "logging_nan_inf_filter": moot("barerl logs each step's loss as it is (nan and inf too)", bool, True),
    "include_num_input_tokens_seen": moot("barerl logs each step's num_tokens", str, "no"),
    "project": moot(_TRACKIO, str, "huggingface"),
    "trackio_space_id": moot(_TRACKIO, str | None, None),
    "trackio_bucket_id": moot(_TRACKIO, str | None, None),
    "trackio_static_space_id": moot(_TRACKIO, object, None),
    "per_device_eval_batch_size": moot("barerl's evaluation packs sequences into passes of "
                                       "max_tokens_per_microbatch tokens", int, 8),
    "prediction_loss_only": moot(_EVAL_LOSS, bool, False),
    "eval_do_concat_batches": moot(_EVAL_LOSS, bool, True),
    "eval_use_gather_object": moot(_EVAL_LOSS, bool, False),
    "eval_accumulation_steps": moot(_EVAL_LOSS, int | None, None),
    "enable_jit_checkpoint": moot("barerl always checkpoints on SIGTERM / SIGINT (it finishes the step, saves and "
                                  "says how to resume)", bool, False),
    "full_determinism": moot("barerl is deterministic by design: same seed and config, same run", bool, False),
    "dataloader_num_workers": moot(_NO_DATALOADER, int, 0),
    "dataloader_pin_memory": moot(_NO_DATALOADER, bool, True),
    "dataloader_persistent_workers": moot(_NO_DATALOADER, bool, False),
    "dataloader_prefetch_factor": moot(_NO_DATALOADER, int | None, None),
    "dataloader_multiprocessing_context": moot(_NO_DATALOADER, str | None, None),
    "label_names": moot("barerl's SFT takes its loss mask from the data's format; there is no label column",
                        object, None),
    "length_column_name": moot("used only by train_sampling_strategy group_by_length, which barerl lacks", str,
                               "length"),
    "ddp_find_unused_parameters": moot(_DDP, bool | None, None),
    "ddp_broadcast_buffers": moot(_DDP, bool | None, None),
    "ddp_static_graph": moot(_DDP, bool | None, None),
    "ddp_backend": moot(_DDP, str | None, None),
    "skip_memory_metrics": moot("barerl plans its memory up front (the memory plan printed at start)", bool, True),
    "do_train": moot("the Trainer does not read it: barerl sft|grpo trains", bool, False),
    "do_eval": moot("the Trainer does not read it: barerl sft evaluates when given eval data", bool, False),
    "do_predict": moot("the Trainer does not read it: barerl trains", bool, False),
    "local_rank": moot("barerl takes each process's rank from mpirun / srun", int, -1),
    # UNSUPPORTED
    "lr_scheduler_kwargs": unsupported("barerl's schedules take no options (cosine is transformers' half cycle, "
                                       "num_cycles 0.5)", dict | None, None, _scheduler_kwargs),
    "optim_args": unsupported("barerl's AdamW takes adam_beta1, adam_beta2, adam_epsilon and weight_decay alone",
                              str | None, None),
    "optim_target_modules": unsupported("there is no GaLore / APOLLO: AdamW updates every trained parameter",
                                        object, None, _off),
    "average_tokens_across_devices": unsupported("barerl normalises a step's loss over all processes together "
                                                 "(SFT: by its loss tokens; GRPO: as loss_type says)", bool, True),
    "label_smoothing_factor": unsupported("barerl's SFT loss has no label smoothing", float, 0.0),
    "bf16_full_eval": unsupported("evaluation runs with training's weights and dtype", bool, False),
    "fp16_full_eval": unsupported("evaluation runs with training's weights and dtype", bool, False),
    "neftune_noise_alpha": unsupported("barerl adds no noise to the embeddings (NEFTune)", float | None, None),
    "auto_find_batch_size": unsupported("barerl does not search for a batch size: max_tokens_per_microbatch "
                                        "bounds one pass's memory", bool, False),
    "logging_first_step": unsupported("barerl logs every logging_steps steps and the last", bool, False),
    "disable_tqdm": unsupported("barerl's progress display has no switch in the config", bool | None, None,
                                _off),
    "eval_delay": unsupported("barerl's SFT evaluates every eval_steps from the start", float, 0.0),
    "eval_on_start": unsupported("barerl's SFT evaluates every eval_steps steps and at the end", bool, False),
    "include_for_metrics": unsupported(_EVAL_LOSS + " (no compute_metrics)", tuple[str, ...], ()),
    "batch_eval_metrics": unsupported(_EVAL_LOSS + " (no compute_metrics)", bool, False),
    "save_on_each_node": unsupported("barerl writes one checkpoint per save, in output_dir", bool, False),
    "push_to_hub": unsupported(_HUB, bool, False),
    "hub_token": unsupported(_HUB, str | None, None),
    "hub_private_repo": unsupported(_HUB, bool | None, None),
    "hub_model_id": unsupported(_HUB, str | None, None),
    "hub_strategy": unsupported(_HUB, str, "every_save"),
    "hub_always_push": unsupported(_HUB, bool, False),
    "hub_revision": unsupported(_HUB, str | None, None),
    "load_best_model_at_end": unsupported(_BEST, bool, False),
    "metric_for_best_model": unsupported(_BEST, str | None, None),
    "greater_is_better": unsupported(_BEST, bool | None, None),
    "ignore_data_skip": unsupported("resuming restores the data order where the run stopped", bool, False),
    "restore_callback_states_from_checkpoint": unsupported("barerl has no callbacks", bool, False),
    "data_seed": unsupported("barerl's seed sets the data order too (data_seed: None or the seed)", int | None,
                             None, _data_seed),
    "accelerator_config": unsupported("barerl does not use Accelerate", object, None, _off),
    "parallelism_config": unsupported(_PARALLEL, object, None, _off),
    "dataloader_drop_last": unsupported(_NO_DATALOADER, bool, False),
    "dataloader_in_order": unsupported(_NO_DATALOADER, bool, True),
    "train_sampling_strategy": unsupported("barerl shuffles each epoch (shuffle_dataset; sequential is "
                                           "shuffle_dataset: false)", str, "random", _sampling),
    "fsdp": unsupported("there is no FSDP: " + _PARALLEL, object, None, _off),
    "fsdp_config": unsupported("there is no FSDP: " + _PARALLEL, object, None, _off),
    "deepspeed": unsupported("there is no DeepSpeed: " + _PARALLEL, object, None, _off),
    "debug": unsupported("barerl has no debug modes", tuple[str, ...], ()),
}


# ---------------------------------------------------------------------------------------------------------
# TRL's SFTConfig's own names


def _refuse_packing(value, config: Values) -> str | None:
    if value != "bfd":
        return (f"packing_strategy={value!r}: barerl packs whole sequences (each cut at max_length), never split "
                "across passes")
    return None


TRL_SFT_NAMES: dict[str, TRLName] = {
    # RENAMED
    "model_init_kwargs": TRL_GRPO_NAMES["model_init_kwargs"],
    # MOOT
    "trust_remote_code": TRL_GRPO_NAMES["trust_remote_code"],
    "pad_to_multiple_of": TRL_GRPO_NAMES["pad_to_multiple_of"],
    "remove_unused_columns": moot("barerl's SFT reads the columns its data format needs", bool, True),
    "dataset_num_proc": moot("barerl tokenizes in the training process", int | None, None),
    "packing_strategy": moot("barerl packs whole sequences in data order into passes of max_tokens_per_microbatch "
                             "tokens", str, "bfd", _refuse_packing),
    "padding_free": moot("barerl never pads: sequences run packed, attention within each", bool, False),
    "eval_packing": moot("barerl's evaluation always packs (attention within each sequence: the loss does not "
                         "change)", bool | None, None),
    "pad_token": moot("barerl never pads", str | None, None),
    # UNSUPPORTED
    "router_aux_loss_coef": TRL_GRPO_NAMES["router_aux_loss_coef"],
    "chat_template_path": unsupported("barerl renders chats with the model folder's own chat template",
                                      str | None, None),
    "dataset_kwargs": unsupported("barerl always prepares the dataset itself (skip_prepare_dataset: false)",
                                  dict | None, None, lambda v, c: not v or v == {"skip_prepare_dataset": False}),
    "eos_token": unsupported("barerl ends each sequence with the tokenizer's eos token", str | None, None),
    "truncation_mode": unsupported("barerl truncates at max_length keeping the start", str, "keep_start"),
    "loss_type": unsupported("barerl's SFT loss is the negative log-likelihood (no DFT)", str, "nll",
                             lambda v, c: v in ("nll", "chunked_nll")),
    "activation_offloading": unsupported("activations stay on the GPU (gradient_checkpointing saves their memory)",
                                         bool, False),
}

# ---------------------------------------------------------------------------------------------------------
# The names of TRL's `trl sft` / `trl grpo` scripts beside their configs: ModelConfig, ScriptArguments and
# DatasetMixtureConfig (both scripts), GRPOScriptArguments (grpo's), all read from one YAML file


def _use_peft(value, config: Values) -> dict:
    return {"lora_r": (config["lora_r"] or 16) if value else 0}  # TRL's lora_r defaults to 16


def _test_split_size(value, config: Values) -> dict:
    return {} if value is None else {"eval_split": value}


_BNB = "the frozen base stays in the working dtype: there is no bitsandbytes quantisation"

TRL_SCRIPT_NAMES: dict[str, TRLName] = {
    # RENAMED
    "model_name_or_path": renamed("model", str | None, None),
    "torch_dtype": renamed("dtype", str | None, None),  # ModelConfig's name before TRL 1.0
    "use_peft": renamed("lora_r (true: LoRA of rank lora_r, 16 when not given; false: 0, every parameter "
                        "trained)", bool, False, _use_peft),
    "dataset_name": renamed("dataset", str | None, None),
    "test_split_size": renamed("eval_split (the fraction of dataset held out)", float | None, None,
                               _test_split_size),
    # MOOT
    "attn_implementation": moot("barerl's attention is its own kernel (packed sequences, flash-attention "
                                "style)", str | None, None),
    "ignore_bias_buffers": moot(_DDP, bool, False),
    # UNSUPPORTED
    "model_revision": unsupported("a model named by its Hub id is its main revision", str, "main"),
    "dataset_streaming": unsupported("barerl reads the whole dataset up front", bool, False),
    "streaming": unsupported("barerl reads the whole dataset up front", bool, False),
    "datasets": unsupported("one dataset a run: `dataset` (no mixtures)", object, None, _off),
    "use_dora": unsupported("DoRA is not implemented: LoRA and rsLoRA (use_rslora)", bool, False),
    "lora_target_parameters": unsupported("LoRA adapts the linear projections lora_target_modules names",
                                          object, None, _off),
    "lora_modules_to_save": unsupported("LoRA trains the adapters alone: no module is trained whole beside them",
                                        object, None, _off),
    "lora_task_type": unsupported("barerl's LoRA adapts causal LMs", str, "CAUSAL_LM"),
    "load_in_8bit": unsupported(_BNB, bool, False),
    "load_in_4bit": unsupported(_BNB, bool, False),
    "bnb_4bit_quant_type": unsupported(_BNB, str, "nf4"),
    "use_bnb_nested_quant": unsupported(_BNB, bool, False),
    "bnb_4bit_quant_storage": unsupported(_BNB, str | None, None),
}

TRL_GRPO_SCRIPT_NAMES: dict[str, TRLName] = {
    "reward_model_name_or_path": unsupported("rewards are Python functions (reward_funcs): there are no reward "
                                             "models", str | None, None),
}

SFT_NAMES = {**TRAINING_ARGS_NAMES, **TRL_SFT_NAMES, **TRL_SCRIPT_NAMES}  # what each job accepts besides its fields
GRPO_NAMES = {**TRAINING_ARGS_NAMES, **TRL_GRPO_NAMES, **TRL_SCRIPT_NAMES, **TRL_GRPO_SCRIPT_NAMES}


def resolve(name: str, value: Any, config: Values, table: Mapping[str, TRLName] = GRPO_NAMES
            ) -> tuple[dict, str | None]:
    """TRL's `name` = `value` (coerced to the entry's type) as (barerl values, the notice to show or None);
    a ConfigError for a value barerl cannot honour. `config`: the values given so far over the defaults."""
    entry = table[name]
    if entry.kind == RENAMED:
        values = entry.convert(value, config) if entry.convert else {entry.why: value}
        taken = ", ".join(f"{k}={v!r}" for k, v in values.items()) or "nothing changes"
        return values, f"TRL's {name} is barerl's {entry.why}: {taken}"
    if entry.kind == MOOT:
        refusal = entry.check(value, config) if entry.check else None
        if refusal:
            raise ConfigError(refusal)
        return {}, f"TRL's {name} has no effect in barerl: {entry.why}"
    accepted = entry.check(value, config) if entry.check else value == entry.default
    if not accepted:
        raise ConfigError(f"TRL's {name} is not supported by barerl ({name}={value!r}): {entry.why}")
    return {}, None


def names_of(kind: str, table: Mapping[str, TRLName] = TRL_GRPO_NAMES) -> list[str]:
    return [name for name, entry in table.items() if entry.kind == kind]
