"""Model shapes and workload sizes of shared/WORKLOADS.md, and how their floors are counted, for the benchmark
scripts' `--shape` and `--workload` options (one place: the scripts take their sizes from here).

Shapes are the models' config.json values (random bf16 weights in every benchmark). A workload names its shape;
`--shape` runs the same sizes on another one. Floors, as WORKLOADS.md counts them:
- generation: every decode step reads all weights once and each live sequence's K and V once, at the copy
  bandwidth measured in the run;
- training: 6 x parameters x tokens + causal attention 3 x (4 L^2 / 2 x head_dim x heads) x layers x sequences,
  at the bf16 matrix rate measured in the run (MFU is beside it against the 989 TFLOP/s of the datasheet too);
- a GRPO step: its generation's floor plus its training's.
"""

from __future__ import annotations

from dataclasses import dataclass

_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "num_key_value_heads": 8, "head_dim": 128,
          "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 40960}
SHAPES = {
    "qwen3-0.6b": {**_QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "tie_word_embeddings": True},
    "qwen3-1.7b": {**_QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "tie_word_embeddings": True},
    "qwen3-4b": {**_QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "tie_word_embeddings": False},
}
QWEN3_06B = SHAPES["qwen3-0.6b"]
SPEC_BF16_TFLOPS = 989.0  # H200 SXM datasheet, dense bf16


@dataclass(frozen=True)
class Generation:
    shape: str
    prompts: int
    samples: int  # per prompt
    prompt_len: int
    new_tokens: int


@dataclass(frozen=True)
class Training:
    shape: str
    sequences: int
    seqlen: int
    loss_tokens: int | None  # trained on the last this many tokens of each sequence (None: all)
    micro_batch: int  # sequences per forward/backward pass


@dataclass(frozen=True)
class Grpo:
    shape: str
    prompts: int
    samples: int
    prompt_len: int
    completion_len: int
    micro_batch: int  # completions per forward/backward pass
    offload: float | None  # offload_optimizer_ratio, None: the state stays on the GPU

    @property
    def generation(self) -> Generation:
        return Generation(self.shape, self.prompts, self.samples, self.prompt_len, self.completion_len)

    @property
    def training(self) -> Training:
        return Training(self.shape, self.prompts * self.samples, self.prompt_len + self.completion_len,
                        self.completion_len, self.micro_batch)


GENERATION = {"G1": Generation("qwen3-0.6b", 8, 8, 128, 1024), "G2": Generation("qwen3-0.6b", 256, 1, 128, 512),
              "G3": Generation("qwen3-4b", 8, 8, 256, 4096)}
TRAINING = {"T1": Training("qwen3-0.6b", 64, 1152, None, 16), "T2": Training("qwen3-4b", 64, 4352, 4096, 4)}
# R3 keeps 90% of its optimizer state on the GPU and streams 10% (docs/MEMORY.md: the plan fits at 1%, 0.1 leaves
# 16 GiB of room in the training phase); L1 trains one 16,640-token completion per pass.
GRPO = {"R1": Grpo("qwen3-0.6b", 8, 8, 128, 1024, 16, None), "R2": Grpo("qwen3-4b", 8, 8, 256, 4096, 4, None),
        "R3": Grpo("qwen3-8b", 8, 8, 256, 2048, 4, 0.1), "L1": Grpo("qwen3-1.7b", 4, 4, 256, 16384, 1, None)}


def model_config(shape: str):
    from barerl.config import ModelConfig

    return ModelConfig.from_dict(SHAPES[shape], source=f"{shape} shape")


def decode_floor_seconds(cfg, g: Generation, bandwidth: float) -> float:
    """Reading all weights and every live token's K and V once per decode step, at `bandwidth` bytes/s."""
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    n, seqs = g.new_tokens, g.prompts * g.samples
    context_tokens = seqs * (n * g.prompt_len + n * (n - 1) / 2)
    return (n * cfg.num_parameters() * 2 + context_tokens * kv_per_token) / bandwidth


def decode_flops(cfg, g: Generation) -> float:
    """Products (2 x parameters per token) and attention (4 x context x head_dim x heads per token and layer)."""
    n, seqs = g.new_tokens, g.prompts * g.samples
    context = seqs * (n * g.prompt_len + n * (n - 1) / 2)
    return 2 * cfg.num_parameters() * n * seqs + 4 * context * cfg.head_dim * cfg.num_attention_heads * (
        cfg.num_hidden_layers)


def training_flops(cfg, t: Training) -> float:
    """6 x parameters x tokens + causal attention (recomputation is not useful work)."""
    L = t.seqlen
    attention = 3 * (4 * L**2 / 2 * cfg.head_dim * cfg.num_attention_heads) * cfg.num_hidden_layers
    return 6 * cfg.num_parameters() * t.sequences * L + attention * t.sequences


def utilisation(flops: float, seconds: float, measured_tflops: float) -> str:
    """'x TFLOP/s, y% MFU (z% of the spec)'."""
    rate = flops / seconds / 1e12
    return f"{rate:.0f} TFLOP/s, {rate / measured_tflops:.1%} MFU ({rate / SPEC_BF16_TFLOPS:.1%} of {SPEC_BF16_TFLOPS:.0f})"
