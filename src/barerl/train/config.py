"""Training configs: one frozen dataclass per job (`SFTConfig`, `GRPOConfig`) over a shared `TrainConfig`.

Design:
- Defaults live only here; every field carries its `--help` text (and, where it has them, its allowed
  `choices` and bounds) in its metadata, so the CLI, validation and docs are built from the fields.
- Names and defaults follow Hugging Face's TrainingArguments and TRL's GRPOConfig / SFTConfig where one
  exists, so a TRL config mostly carries over. The vLLM importance-sampling options lose their `vllm_`
  prefix (the engine is ours): `importance_sampling_correction`, `importance_sampling_mode` (TRL's four
  values), `importance_sampling_cap`.
- TRL's names that barerl does not define (GRPOConfig's or SFTConfig's own, and the TrainingArguments keys
  both carry: `bf16`, `optim`, `push_to_hub`, ...) are accepted where config keys are read (files, flags,
  `config_from_dict`), each as train/trl_names.py's tables say: renamed onto barerl's key, moot (no effect,
  with a notice), or unsupported (TRL's default alone). `GRPOConfig(**kwargs)` stays barerl's own names.
- One coercion path: `__post_init__` converts every field to its declared type (so "1e-6" from YAML or
  the command line becomes a float) and validates it; errors are `ConfigError`s naming the key, the
  expected type and the value. `load_config` adds where the value came from (file or --flag).
- Sources, later wins: defaults, a YAML or TOML file, then `--key value` overrides. Unknown keys are
  errors with the closest known key suggested.
- Multi-turn rollouts are a concern of their own (`EnvironmentConfig`: the environment or tools, the limits
  of an episode's turns), declared once. GRPOConfig holds its fields directly, as TRL's GRPOConfig holds
  `tools`: the YAML and the command line stay flat (`tools: [...]`, `--max_turns 4`), `--help` lists them
  in a group of their own, and environment code takes the GRPOConfig wherever it takes an EnvironmentConfig.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import sys
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from barerl.config import ConfigError
from barerl.model.lora import ALL_LINEAR, TARGET_MODULES, resolve_target_modules
from barerl.model.recompute import DEFAULT_KEEP, RECOMPUTABLE
from barerl.model.sampling_filter import SamplingFilter, SamplingFilterError
from barerl.train.trl_names import GRPO_NAMES, SFT_NAMES, TRAINING_ARGS_NAMES, TRLName, TRLNameNotice, resolve

T = typing.TypeVar("T", bound="TrainConfig")


def opt(default: Any, help: str, *, choices: tuple | None = None, min: float | None = None,
        max: float | None = None, gt: float | None = None) -> Any:
    """A config field: default, help text, and optional choices / bounds (min, max inclusive; gt strict)."""
    meta = {"help": help, "choices": choices, "min": min, "max": max, "gt": gt}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainConfig:
    """Options shared by every training job."""

    # What to train on, where to write, where to run
    model: str | None = opt(None, "Model folder (Hugging Face format: config.json + safetensors + tokenizer), "
                            ".gguf file, or Hugging Face Hub id (ORG/NAME; the hub extra).")
    dataset: str | None = opt(None, "Training data: a JSONL / Parquet file, a `datasets` folder, or a Hugging Face "
                              "Hub dataset id (ORG/NAME; needs the datasets library).")
    dataset_config: str | None = opt(None, "The configuration (subset) of a Hub dataset (main for openai/gsm8k).")
    dataset_train_split: str = opt("train", "The split of `dataset` to train on (a Hub dataset, or a datasets "
                                   "folder with splits).")
    dataset_test_split: str = opt("test", "The split of `eval_dataset` to evaluate on (as dataset_train_split).")
    eval_dataset: str | None = opt(None, "Evaluation data (same forms as `dataset`; its config: dataset_config).")
    eval_split: float = opt(0.0, "Fraction of `dataset` held out for evaluation when `eval_dataset` is not "
                            "given (0: no held-out split).", min=0.0, max=0.5)
    output_dir: str = opt("outputs", "Folder for checkpoints, metrics.jsonl, samples.jsonl and plots.")
    overwrite_output_dir: bool = opt(False, "Start a new run in an output_dir that holds another one, deleting "
                                     "what that run wrote (without it, a folder in use is refused unless resuming).")
    run_name: str | None = opt(None, "Name of the run in TensorBoard / W&B (default: the output folder's name).")
    seed: int = opt(42, "Seed for data order, initialisation and sampling: same seed and config, same run.")
    device: str = opt("auto", "Where to run: auto (cuda if available), cpu or cuda.",
                      choices=("auto", "cpu", "cuda"))
    dtype: str = opt("auto", "Working weight dtype: auto (bfloat16 on cuda, float32 on cpu), bfloat16, "
                     "float16 or float32. Master weights and optimizer moments are always float32.",
                     choices=("auto", "bfloat16", "float16", "float32"))
    # Optimizer and schedule
    learning_rate: float = opt(5e-5, "Peak learning rate of AdamW.", min=0.0)
    lr_scheduler_type: str = opt("linear", "Learning-rate schedule after warmup.",
                                 choices=("constant", "constant_with_warmup", "linear", "cosine"))
    warmup_ratio: float = opt(0.0, "Fraction of the training steps used for linear warmup "
                              "(ignored when warmup_steps > 0).", min=0.0, max=1.0)
    warmup_steps: int = opt(0, "Steps of linear warmup from 0 to learning_rate (overrides warmup_ratio).", min=0)
    weight_decay: float = opt(0.0, "Decoupled AdamW weight decay (never applied to norms and biases).", min=0.0)
    adam_beta1: float = opt(0.9, "AdamW beta1.", min=0.0, max=0.999999)
    adam_beta2: float = opt(0.999, "AdamW beta2.", min=0.0, max=0.999999)
    adam_epsilon: float = opt(1e-8, "AdamW epsilon.", gt=0.0)
    max_grad_norm: float | None = opt(1.0, "Clip gradients to this global L2 norm (None or 0: no clipping).",
                                      min=0.0)
    stochastic_rounding: bool = opt(True, "Round the fp32 master weights to bf16 working weights "
                                    "stochastically (unbiased) after each step; rounding to nearest loses "
                                    "updates below bf16's resolution, i.e. most of them at small learning rates.")
    # LoRA: the base frozen, low-rank adapters trained (peft's parametrisation; TRL's option names)
    lora_r: int = opt(0, "LoRA rank: > 0 freezes the base weights and trains rank-r adapters of "
                      "lora_target_modules (fp32 master and AdamW state for the adapters alone; the engine applies "
                      "them on the fly); 0 trains every parameter.", min=0)
    lora_alpha: float = opt(32.0, "LoRA scale numerator: an adapter adds (lora_alpha / lora_r) B A to its weight.",
                            gt=0.0)
    use_rslora: bool = opt(False, "Rank-stabilised LoRA: an adapter adds (lora_alpha / sqrt(lora_r)) B A instead, "
                           "so its update keeps its size as the rank grows.")
    lora_dropout: float = opt(0.0, "Dropout on the adapters' inputs in training passes (never in generation; "
                              "in GRPO it sets the trainer's log-probs apart from the engine's).", min=0.0,
                              max=0.99)
    lora_target_modules: tuple[str, ...] = opt(
        (ALL_LINEAR,), f"Projections that get adapters, comma-separated: {', '.join(TARGET_MODULES)}, or "
        f"{ALL_LINEAR} (all of them; never the LM head).", choices=(*TARGET_MODULES, ALL_LINEAR))
    lora_adapter: str | None = opt(None, "A PEFT adapter folder (adapter_config.json + adapter_model.safetensors) "
                                   "to start from, over `model`: turns LoRA on with the adapter's r, lora_alpha, use_rslora "
                                   "and target modules.")
    # Length of training and batching
    max_steps: int = opt(-1, "Number of optimizer steps; -1: derived from num_train_epochs.", min=-1)
    num_train_epochs: float = opt(3.0, "Passes over the dataset (used when max_steps is -1).", gt=0.0)
    per_device_train_batch_size: int = opt(8, "Sequences per micro-batch (GRPO: completions).", min=1)
    gradient_accumulation_steps: int = opt(1, "Micro-batches accumulated into one optimizer step.", min=1)
    max_tokens_per_microbatch: int | None = opt(
        8192, "Token budget of one packed forward/backward pass: larger batches are split and their "
        "gradients accumulated (the result does not change). None: one pass per batch. Activations grow with "
        "it: on a CPU (fp32) ~1.1 MB per token for SmolLM2-135M without gradient_checkpointing.", min=1)
    gradient_checkpointing: bool = opt(False, "Recompute activations in backward to save memory.")
    gradient_checkpointing_keep: tuple[str, ...] = opt(
        DEFAULT_KEEP, "With gradient_checkpointing: ops whose outputs are kept through the forward pass rather "
        "than recomputed, comma-separated (attention, linear, qk_norm_rope, swiglu, rmsnorm): each one kept "
        "makes backward faster and takes more memory.", choices=RECOMPUTABLE)
    # Logging, evaluation, checkpoints
    logging_steps: int = opt(1, "Log metrics (progress bar, TensorBoard, W&B) every N steps; metrics.jsonl "
                             "gets every logged step.", min=1)
    report_to: tuple[str, ...] = opt(("jsonl",), "Where metrics go, comma-separated: jsonl, tensorboard "
                                     "(needs tensorboardX), wandb (needs wandb), none.",
                                     choices=("jsonl", "tensorboard", "wandb", "none"))
    eval_steps: int | None = opt(None, "Evaluate every N steps (None: at the end only).", min=1)
    save_strategy: str = opt("steps", "When to write checkpoints: steps (every save_steps and at the end), epoch "
                             "(after each pass over the dataset and at the end) or no (never: the run leaves "
                             "metrics and curves only; for a benchmark, or a model whose optimizer state cannot "
                             "come back to the GPU to be saved).", choices=("steps", "epoch", "no"))
    save_steps: int = opt(500, "Write a checkpoint every N steps (0: only at the end).", min=0)
    save_total_limit: int | None = opt(2, "Keep at most this many checkpoints, deleting the oldest (None: keep "
                                       "all; a checkpoint holds the weights and 12 bytes per parameter of "
                                       "optimizer state).", min=1)
    save_only_model: bool = opt(False, "Checkpoints hold the model alone, without the optimizer state (a quarter "
                                "of the size with fp32 weights): they load as models but cannot be resumed; the "
                                "one a stop signal leaves is always whole.")
    resume_from_checkpoint: str | None = opt(None, "Checkpoint folder to resume from, or 'latest' for the "
                                             "newest complete checkpoint in output_dir.")
    # Several processes (started by mpirun / mpiexec / srun, one per GPU; see barerl.distributed)
    gradient_sum: str = opt("accumulate", "How a step's micro-batch gradients add up: accumulate (into one "
                            "buffer, in order; N processes agree with one to rounding) or tree (each micro-batch's "
                            "gradient alone, summed in a fixed binary tree: any power-of-two number of processes "
                            "gives one process's bits, for up to ceil(log2 k) more fp32 gradient buffers with k "
                            "micro-batches per process).", choices=("accumulate", "tree"))
    zero_stage: int = opt(1, "With several processes: 1 shards the fp32 master weights and AdamW moments across "
                          "them (ZeRO-1: gradients reduce-scattered, updated weights all-gathered); 0 keeps a whole "
                          "copy on each (gradients all-reduced).", min=0, max=1)
    ddp_timeout: float = opt(1800.0, "Seconds a process waits for the others at a collective before it ends the "
                             "whole job, naming the processes that did not come (dead or hung).", gt=0.0)
    ddp_bucket_cap_mb: float = opt(64.0, "MiB of gradients (or weights) one bucket of a collective moves to a "
                                   "process: bounds its staging memory.", gt=0.0)

    def __post_init__(self):
        coerce_fields(self)
        if self.resume_from_checkpoint is not None and self.resume_from_checkpoint.lower() in ("true", "false"):
            latest = self.resume_from_checkpoint.lower() == "true"
            object.__setattr__(self, "resume_from_checkpoint", "latest" if latest else None)
        resolve_target_modules(self.lora_target_modules)  # 'all-linear' alone
        if "none" in self.report_to and len(self.report_to) > 1:
            raise ConfigError(f"report_to: 'none' cannot be combined with others, got {list(self.report_to)}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (tuples as lists), for checkpoints and run metadata."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class SFTConfig(TrainConfig):
    """Supervised fine-tuning on chat (`messages`), prompt-completion or plain-text data."""

    learning_rate: float = opt(2e-5, "Peak learning rate of AdamW.", min=0.0)
    max_length: int | None = opt(1024, "Sequences longer than this are truncated (keeping the start). "
                                 "None: no truncation.", min=1)
    packing: bool = opt(True, "Pack several sequences into one micro-batch up to max_tokens_per_microbatch "
                        "(attention stays within each sequence, so the loss does not change).")
    dataset_text_field: str = opt("text", "Column with the text of language-modeling datasets.")
    completion_only_loss: bool | None = opt(None, "Loss only on the completion of prompt-completion data. "
                                            "None: yes for prompt-completion data, full sequence for text.")
    assistant_only_loss: bool = opt(False, "Loss only on assistant turns of chat (`messages`) data.")
    shuffle_dataset: bool = opt(True, "Shuffle the training data each epoch.")


ISOLATION_FEATURES = ("network", "processes", "filesystem", "unprivileged")  # what the sandbox may isolate


@dataclass(frozen=True)
class EnvironmentConfig:
    """Multi-turn options: which environment (or tools), and the limits of an episode's turns."""

    environment_factory: str | None = opt(None, "Environment of each episode: 'module:Class' or "
                                          "'path/to/file.py:Class', any callable returning an Environment.")
    tools: tuple[str, ...] = opt((), "Tools the model may call (TRL's tools=): 'module:function', "
                                 "'path/to/file.py:function' or the built-in 'python' (sandboxed).")
    max_turns: int = opt(4, "Model turns per episode at most; an episode cut there is recorded as truncated.",
                         min=1)
    max_tokens_per_turn: int | None = opt(None, "Tokens the model may sample in one turn (None: what is left of "
                                          "the episode's max_completion_length).", min=1)
    max_tool_calls_per_turn: int = opt(8, "Tool calls run per model turn; further calls get an error.", min=1)
    tool_timeout: float = opt(30.0, "Seconds a tool call may take; a late call gets an error response.", gt=0.0)
    tool_num_workers: int = opt(8, "Tool calls running at once, over all episodes.", min=1)
    max_tool_response_chars: int = opt(4000, "Characters of a tool's response kept (the rest is cut, noted).",
                                       min=16)
    step_timeout: float = opt(600.0, "Seconds an environment's step (its tool calls included) may take; a later "
                              "step ends its episode, recorded as an environment error.", gt=0.0)
    sandbox_require: tuple[str, ...] = opt((), "Sandbox isolations without which the built-in python tool "
                                           "refuses to run: network, processes, filesystem, unprivileged.",
                                           choices=ISOLATION_FEATURES)

    def __post_init__(self):
        coerce_fields(self)
        self.check_environment()

    def check_environment(self) -> None:
        if self.environment_factory and self.tools:
            raise ConfigError("environment_factory and tools: set one, not both (an environment that wants "
                              "tools can subclass ToolEnvironment)")

    @property
    def multi_turn(self) -> bool:
        """Whether episodes talk to an environment (else: one completion per prompt)."""
        return bool(self.environment_factory or self.tools)


@dataclass(frozen=True)
class GRPOConfig(TrainConfig, EnvironmentConfig):
    """GRPO: sample a group of completions per prompt with the engine, score them, update on advantages."""

    learning_rate: float = opt(1e-6, "Peak learning rate of AdamW.", min=0.0)
    # Rewards
    reward_funcs: tuple[str, ...] = opt((), "Reward functions, comma-separated or repeated: 'module:function', "
                                        "'path/to/file.py:function' or a built-in name.")
    reward_weights: tuple[float, ...] | None = opt(None, "Weight of each reward function (None: all 1.0).")
    reward_num_workers: int = opt(0, "Worker processes for the reward functions (0: a thread of the trainer; "
                                  "use workers for rewards that run code or call out).", min=0)
    reward_timeout: float | None = opt(300.0, "Seconds a reward call (one group of completions) may take, once the "
                                       "trainer waits for it, before it is stopped and the run fails naming it "
                                       "(None: no limit, a reward that never returns hangs the run).", gt=0.0)
    scale_rewards: str = opt("group", "Advantage scaling: group (divide by the group's reward std), batch "
                             "(by the batch's std) or none (Dr. GRPO). true/false mean group/none.",
                             choices=("group", "batch", "none", "true", "false"))
    dynamic_sampling: bool = opt(False, "Drop groups whose rewards are all equal (zero advantage) and sample "
                                 "more prompts to fill the batch, as DAPO does.")
    dynamic_sampling_max_rounds: int = opt(3, "Extra generation rounds dynamic sampling may take per step to "
                                           "fill the batch with informative groups.", min=0)
    # Generation
    num_generations: int = opt(8, "Completions sampled per prompt (the group size).", min=2)
    max_prompt_length: int | None = opt(512, "Prompts longer than this are truncated from the left.", min=1)
    # opt() makes a field whose default is None, not a shared mutable default (coerce copies a given dict)
    chat_template_kwargs: dict | None = opt(  # noqa: RUF009
        None, "Variables for the chat template when it renders prompts and multi-turn observations (TRL's), "
        "e.g. {\"enable_thinking\": false} for Qwen3; a JSON object on the command line.")
    max_completion_length: int = opt(256, "Maximum tokens generated per completion (multi-turn: all tokens of an "
                                     "episode after its prompt, the model's and the environment's, as TRL).", min=1)
    # the sampling distribution, validated as one SamplingFilter (the engine's and the trainer's)
    temperature: float = opt(1.0, "Sampling temperature, > 0 (the trainer's log-probs use the same one).")
    top_p: float = opt(1.0, "Nucleus sampling, in (0, 1]: keep the smallest set of tokens with this total "
                       "probability.")
    top_k: int = opt(0, "Keep only the k most likely tokens (0 or -1: no top-k).")
    min_p: float | None = opt(None, "Drop tokens below min_p times the top token's probability, in [0, 1].")
    shuffle_dataset: bool = opt(True, "Shuffle the prompts each epoch.")
    batch_invariant: bool = opt(True, "Batch-invariant kernels (GPU, bf16/fp16): the engine's sampling log-probs "
                                "and the trainer's are computed with the same arithmetic, bit for bit, so "
                                "the train/inference mismatch is ~0 (split-K-free products; decode attention "
                                "in the training kernel's order).")
    offload_optimizer: bool = opt(False, "Keep the fp32 master weights and Adam moments in host memory and the "
                                  "(zero) gradients freed while the engine generates, so the GPU holds the "
                                  "working weights and the KV cache alone; each optimizer step streams the state "
                                  "through the GPU in chunks (one host<->GPU round trip of it per step; the "
                                  "master travels as its low 16 bits where bf16 working weights hold the rest).")
    offload_optimizer_ratio: float = opt(1.0, "With offload_optimizer: the share of the optimizer state kept in "
                                         "host memory; the rest stays on the GPU, which saves its round trip "
                                         "over the link each step for the GPU memory it takes.", gt=0.0, max=1.0)
    generation_batch_size: int | None = opt(None, "Completions generated at once (None: "
                                            "per_device_train_batch_size * steps_per_generation).", min=1)
    steps_per_generation: int | None = opt(None, "Optimizer steps taken on one generation batch (None: "
                                           "gradient_accumulation_steps).", min=1)
    # Loss
    loss_type: str = opt("dapo", "Token aggregation: grpo (per-sequence mean), dr_grpo (divide by "
                         "max_completion_length), dapo (tokens of the whole step), bnpo (tokens of the "
                         "micro-batch).", choices=("grpo", "dr_grpo", "dapo", "bnpo"))
    beta: float = opt(0.0, "KL coefficient to a frozen reference model (0: no reference model is kept).",
                      min=0.0)
    epsilon: float = opt(0.2, "Lower clipping range of the importance ratio.", min=0.0)
    epsilon_high: float | None = opt(None, "Upper clipping range (None: epsilon; DAPO clip-higher uses 0.28).",
                                     min=0.0)
    delta: float | None = opt(None, "Two-sided clipping (INTELLECT-2): the unclipped term's ratio is capped at "
                              "delta, bounding the loss of negative-advantage tokens (None: off; TRL suggests > "
                              "1 + epsilon_high).", gt=1.0)
    top_entropy_quantile: float = opt(1.0, "Policy loss on the top share of each micro-batch's loss tokens by "
                                      "entropy only (Beyond the 80/20 Rule: 0.2); 1: all tokens. Below 1 the "
                                      "LM head's backward runs after the whole batch's forward (no fused chunks).",
                                      min=0.0, max=1.0)
    num_iterations: int = opt(1, "Updates per generation batch (mu); old log-probs are kept for the ratio.",
                              min=1)
    importance_sampling_level: str = opt("token", "Ratio per token, or per sequence (GSPO).",
                                         choices=("token", "sequence"))
    mask_truncated_completions: bool = opt(False, "Exclude completions cut at max_completion_length from the "
                                           "loss.")
    importance_sampling_correction: bool = opt(True, "Correct for the engine's sampling log-probs differing "
                                               "from the trainer's (TIS / MIS).")
    importance_sampling_mode: str = opt("sequence_mask", "How the correction treats ratios above the cap: "
                                        "token_truncate, token_mask, sequence_truncate or sequence_mask.",
                                        choices=("token_truncate", "token_mask", "sequence_truncate",
                                                 "sequence_mask"))
    importance_sampling_cap: float = opt(3.0, "Cap C of the importance-sampling correction.", gt=0.0)
    # Logging
    log_completions_steps: int = opt(10, "Write sample prompts and completions to samples.jsonl every N steps "
                                     "(0: never).", min=0)

    def __post_init__(self):
        super().__post_init__()
        self.check_environment()
        try:
            greedy = self.sampling_filter.greedy
        except SamplingFilterError as e:
            raise ConfigError(str(e)) from None
        if greedy:
            raise ConfigError("temperature: GRPO samples each group from the policy, so it must be > 0, got 0")
        if self.scale_rewards in ("true", "false"):
            object.__setattr__(self, "scale_rewards", "group" if self.scale_rewards == "true" else "none")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ConfigError(f"reward_weights: {len(self.reward_weights)} weights for "
                              f"{len(self.reward_funcs)} reward_funcs {list(self.reward_funcs)}")
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise ConfigError("generation_batch_size and steps_per_generation: set at most one")
        if self.offload_optimizer_ratio != 1.0 and not self.offload_optimizer:
            raise ConfigError(f"offload_optimizer_ratio={self.offload_optimizer_ratio}: applies only with "
                              "offload_optimizer=true (nothing is offloaded without it)")
        if self.effective_generation_batch_size % self.num_generations:
            raise ConfigError(
                f"num_generations: the generation batch ({self.effective_generation_batch_size} completions) "
                f"must be a multiple of num_generations ({self.num_generations})")

    @property
    def sampling_filter(self) -> SamplingFilter:
        """The distribution the engine samples rollouts from, which the trainer's log-probs use too."""
        return SamplingFilter(self.temperature, self.top_k, self.top_p, 0.0 if self.min_p is None else self.min_p)

    @property
    def effective_steps_per_generation(self) -> int:
        return self.steps_per_generation_on(1)

    @property
    def effective_generation_batch_size(self) -> int:
        return self.generation_batch_size_on(1)

    def steps_per_generation_on(self, num_processes: int) -> int:
        """TRL's steps_per_generation with `num_processes` processes (per_device_train_batch_size is each
        one's)."""
        if self.steps_per_generation is not None:
            return self.steps_per_generation
        if self.generation_batch_size is not None:
            return max(1, self.generation_batch_size // (self.per_device_train_batch_size * num_processes))
        return self.gradient_accumulation_steps

    def generation_batch_size_on(self, num_processes: int) -> int:
        """Completions of one generation round, all `num_processes` processes together (TRL's rule)."""
        if self.generation_batch_size is not None:
            return self.generation_batch_size
        return self.per_device_train_batch_size * num_processes * self.steps_per_generation_on(num_processes)


# ---------------------------------------------------------------------------------------------------------
# Coercion and validation


def _unwrap_optional(tp):
    """X for `X | None`, else tp itself (only Optional unions are used in configs)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    return tp


def type_name(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args).replace("NoneType", "None")
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    return getattr(tp, "__name__", str(tp))


def coerce(key: str, value: Any, tp) -> Any:
    """`value` (from YAML, TOML, the command line or Python) as the field type `tp`, or a ConfigError."""
    if _unwrap_optional(tp) is not tp:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            return None
        return coerce(key, value, _unwrap_optional(tp))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        items = value if isinstance(value, (list, tuple)) else [value]
        parts = []
        for item in items:  # "a,b" and repeated flags both give lists
            parts += [s.strip() for s in item.split(",") if s.strip()] if isinstance(item, str) else [item]
        return tuple(coerce(key, p, args[0]) for p in parts)
    try:
        return _SCALARS[tp](value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}") from None


def _to_bool(v) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
        return v.strip().lower() in ("true", "yes", "1", "on")
    raise ValueError(v)


def _to_int(v) -> int:
    if isinstance(v, bool):
        raise TypeError(v)
    if isinstance(v, float) and not v.is_integer():
        raise ValueError(v)
    return int(v) if isinstance(v, (int, float)) else int(str(v).strip())


def _to_float(v) -> float:
    if isinstance(v, bool):
        raise TypeError(v)
    return float(v) if isinstance(v, (int, float)) else float(str(v).strip())


def _to_dict(v) -> dict:
    if isinstance(v, str):  # the command line's JSON object
        v = json.loads(v)
    if not isinstance(v, dict):
        raise TypeError(v)
    return dict(v)  # a copy: the frozen config never shares the caller's dict


def _to_str(v) -> str:
    if isinstance(v, (list, tuple, dict)) or v is None:
        raise TypeError(v)
    return str(v).lower() if isinstance(v, bool) else str(v)


# object: taken as given (TRL names whose value barerl only compares with their default)
_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str, dict: _to_dict, object: lambda v: v}


def coerce_fields(config) -> None:
    """Convert every field of a frozen config dataclass built with `opt` to its declared type, in place, and
    check its choices and bounds (ConfigError naming the field otherwise)."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = coerce(f.name, getattr(config, f.name), hints[f.name])
        _check(f, value)
        object.__setattr__(config, f.name, value)


def _check(f: dataclasses.Field, value: Any) -> None:
    meta = f.metadata
    for v in value if isinstance(value, tuple) else (value,):
        if v is None:
            continue
        if meta.get("choices") and v not in meta["choices"]:
            raise ConfigError(f"{f.name}: must be one of {list(meta['choices'])}, got {v!r}")
        low, high, gt = meta.get("min"), meta.get("max"), meta.get("gt")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isnan(v):  # NaN passes every comparison: no bound would refuse it
            raise ConfigError(f"{f.name}: must be a number, got nan")
        if (low is not None and v < low) or (high is not None and v > high) or (gt is not None and v <= gt):
            bounds = [f">= {low}"] * (low is not None) + [f"> {gt}"] * (gt is not None)
            bounds += [f"<= {high}"] * (high is not None)
            raise ConfigError(f"{f.name}: must be {' and '.join(bounds)}, got {v!r}")


# ---------------------------------------------------------------------------------------------------------
# Loading: file, then --key value overrides


def _unknown_key(cls: type, key: str, source: str) -> ConfigError:
    names = [f.name for f in dataclasses.fields(cls)] + list(trl_names(cls))
    close = difflib.get_close_matches(key, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{source}: unknown key {key!r} for {cls.__name__}{hint}")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A flat mapping from a .yaml/.yml or .toml file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        from barerl.train.config_yaml import load_yaml

        parse, errors = load_yaml, yaml.YAMLError
    elif path.suffix == ".toml":
        toml = _toml()
        parse, errors = toml.loads, toml.TOMLDecodeError
    else:
        raise ConfigError(f"config file {path}: expected .yaml, .yml or .toml")
    try:
        data = parse(text)
    except errors as e:  # the parsers' messages carry the line number
        raise ConfigError(f"config file {path}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of keys to values, got {type(data).__name__}")
    return data


def _toml():
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:
        import tomli
    except ImportError:
        raise ConfigError("reading TOML on Python < 3.11 needs tomli (pip install tomli)") from None
    return tomli


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (naming the flag) instead of exiting."""

    def error(self, message: str):
        raise ConfigError(f"command line: {message}")


def _metavar(tp, meta) -> str:
    if meta.get("choices"):
        return "{" + ",".join(meta["choices"]) + "}"
    tp = _unwrap_optional(tp)
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0].__name__.upper()
        return f"{item}[,{item}...]"
    return tp.__name__.upper()


def _show(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def build_argparser(cls: type, prog: str | None = None) -> argparse.ArgumentParser:
    """A parser for `barerl sft|grpo`: `--config` and every field, with help and defaults (`--help`).

    Its errors are ConfigErrors; `parse_overrides` / `load_config` add the closest-key suggestion.
    """
    parser = _Parser(prog=prog, description=cls.__doc__, usage="%(prog)s [--config FILE] [--key VALUE ...]",
                     allow_abbrev=False)
    add_config_arguments(parser, cls)
    return parser


_GROUP_TITLES = {TrainConfig: "training options",
                 EnvironmentConfig: "multi-turn options (with environment_factory or tools)"}


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add `--config` and one `--name VALUE` per field to an existing parser (`config_from_namespace` reads
    them). Values stay strings until the config converts them; bare bool flags mean true; list flags repeat.
    """
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="YAML or TOML file of keys; --key flags override it.")
    groups = {base: parser.add_argument_group(title) for base, title in _GROUP_TITLES.items()
              if issubclass(cls, base) and base is not cls}
    own = parser.add_argument_group(f"{cls.__name__} options")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, meta = hints[f.name], f.metadata
        kwargs: dict[str, Any] = {"nargs": "?", "const": "true"} if tp is bool else {}
        if typing.get_origin(_unwrap_optional(tp)) is tuple:
            kwargs["action"] = "append"
        help_text = f"{meta['help']} (default: {_show(f.default)})".replace("%", "%%")
        owner = next((base for base in groups if f.name in {g.name for g in dataclasses.fields(base)}), None)
        group = groups.get(owner, own)
        group.add_argument(f"--{f.name}", metavar=_metavar(tp, meta), help=help_text, default=argparse.SUPPRESS,
                           **kwargs)
    for name, entry in trl_names(cls).items():  # accepted, kept out of --help (train/trl_names.py lists them)
        kwargs = {"nargs": "?", "const": "true"} if _unwrap_optional(entry.tp) is bool else {}
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def parse_overrides(cls: type, tokens: list[str]) -> dict[str, Any]:
    """['--key', 'value', '--key=value', '--flag', ...] -> {key: raw string(s)}, `config` among them."""
    namespace, extra = build_argparser(cls).parse_known_args(tokens)
    if extra:
        flag = next((t for t in extra if t.startswith("--")), None)
        if flag is None:
            raise ConfigError(f"command line: unexpected value {extra[0]!r} (values follow a --key)")
        raise _unknown_key(cls, flag[2:].partition("=")[0], "command line")
    return vars(namespace)


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Defaults, then the YAML/TOML file at `path` (or `--config` among the overrides), then `--key value`."""
    return _from_flags(cls, path, parse_overrides(cls, overrides or []))


def config_from_namespace(cls: type[T], namespace: argparse.Namespace) -> T:
    """The config from a namespace parsed by a parser that `add_config_arguments` filled."""
    names = {f.name for f in dataclasses.fields(cls)} | set(trl_names(cls)) | {"config"}
    return _from_flags(cls, None, {k: v for k, v in vars(namespace).items() if k in names})


def config_from_argv(cls: type[T], argv: list[str], prog: str | None = None) -> T:
    """`barerl sft|grpo [--config FILE] [--key value ...]`; -h/--help prints every option and exits."""
    if "-h" in argv or "--help" in argv:
        build_argparser(cls, prog).print_help()
        raise SystemExit(0)
    return load_config(cls, None, argv)


def config_from_dict(cls: type[T], values: dict[str, Any], source: str = "arguments") -> T:
    """The config from a mapping, read as a config file's: TRL's names as train/trl_names.py says (the
    Python form of a TRL config; `cls(**values)` takes barerl's names alone)."""
    return _from_sources(cls, [(source, values)])


def trl_names(cls: type) -> dict[str, TRLName]:
    """TRL's names that `cls` accepts besides its fields (train/trl_names.py)."""
    if issubclass(cls, GRPOConfig):
        return GRPO_NAMES
    return SFT_NAMES if issubclass(cls, SFTConfig) else TRAINING_ARGS_NAMES


def _from_flags(cls: type[T], path: str | Path | None, flags: dict[str, Any]) -> T:
    flags = dict(flags)
    path = flags.pop("config", None) or path
    return _from_sources(cls, [(f"config file {path}", read_config_file(path) if path else {}),
                               ("command line", flags)])


def _from_sources(cls: type[T], sources: list[tuple[str, dict[str, Any]]]) -> T:
    """The config from (where, raw mapping) pairs, a later one winning; TRL's names go after barerl's, so
    that their conversions see the barerl values given with them (and the TRL names given)."""
    hints, trl = typing.get_type_hints(cls), trl_names(cls)
    values: dict[str, Any] = {}
    given_in: dict[str, int] = {}  # barerl key -> index of the source that gave it
    pending = []
    trl_given = {name: entry.default for name, entry in trl.items()}  # TRL's values, a later source winning
    for index, (source, raw) in enumerate(sources):
        for key, value in raw.items():
            if key in trl:
                trl_given[key] = _coerce_in(source, key, value, trl[key].tp)
                pending.append((index, source, key, trl_given[key]))
            elif key not in hints:
                raise _unknown_key(cls, key, source)
            else:
                values[key], given_in[key] = _coerce_in(source, key, value, hints[key]), index
    for index, source, key, value in pending:
        for name, converted in _from_trl(cls, source, key, value, {**trl_given, **values}).items():
            converted = _coerce_in(source, name, converted, hints[name])
            if given_in.get(name, -1) > index:  # barerl's key given later (a flag over the file) wins
                continue
            if given_in.get(name) == index and values[name] != converted:
                raise ConfigError(f"{source}: TRL's {key} means {name}={converted!r}, but {name} is given as "
                                  f"{values[name]!r}: give one of them")
            values[name], given_in[name] = converted, index
    return cls(**values)


def _from_trl(cls: type, source: str, key: str, value: Any, values: dict[str, Any]) -> dict[str, Any]:
    """TRL's key (its value coerced) as barerl values (uncoerced), its notice warned; errors name the source."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    try:
        converted, notice = resolve(key, value, {**defaults, **values}, trl_names(cls))
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    if notice:
        warnings.warn(f"{source}: {notice}", TRLNameNotice, stacklevel=2)
    return converted


def _coerce_in(source: str, key: str, value: Any, tp) -> Any:
    try:
        return coerce(key, value, tp)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
