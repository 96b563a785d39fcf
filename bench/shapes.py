"""Model shapes and workload sizes of shared/WORKLOADS.md, and how their floors are counted: the one place the
benchmark scripts take them from (`--workload`, `--shape`, `--quick`).

Shapes are the models' config.json values (random bf16 weights in every benchmark). A workload names its shape;
`--shape` runs the same sizes on another one, and its records then go under `NAME-SHAPE` (`G1-qwen3-4b`), apart
from the preset's. `--quick` keeps a workload's structure (prompts, samples, micro-batches, a loss on part of
each sequence) at a tiny width and length, for a CPU smoke test of the same code path. Floors, as WORKLOADS.md
counts them:
- generation: every decode step reads all weights once and each live sequence's K and V once, at the copy
  bandwidth measured in the run;
- training: 6 x parameters x tokens + causal attention 3 x (4 L^2 / 2 x head_dim x heads) x layers x sequences,
  at the bf16 matrix rate measured in the run (so the fraction of the floor is the MFU; against the 989 TFLOP/s
  of the datasheet too);
- a GRPO step: its generation's floor plus its training's.
"""

from __future__ import annotations

import dataclasses
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
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # --quick: any shape, this small
SPEC_BF16_TFLOPS = 989.0  # H200 SXM datasheet, dense bf16
QUICK_NEW_TOKENS = 8  # --quick's generation length


@dataclass(frozen=True)
class Generation:
    shape: str
    prompts: int
    samples: int  # per prompt
    prompt_len: int
    new_tokens: int

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    def quick(self) -> Generation:
        return dataclasses.replace(self, new_tokens=QUICK_NEW_TOKENS)


@dataclass(frozen=True)
class Training:
    shape: str
    sequences: int
    seqlen: int
    loss_tokens: int | None  # trained on the last this many tokens of each sequence (None: all)
    micro_batch: int  # sequences per forward/backward pass

    def quick(self) -> Training:
        return dataclasses.replace(self, sequences=4, seqlen=64, micro_batch=2,
                                   loss_tokens=None if self.loss_tokens is None else 48)


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
    def completions(self) -> int:
        return self.prompts * self.samples

    @property
    def generation(self) -> Generation:
        return Generation(self.shape, self.prompts, self.samples, self.prompt_len, self.completion_len)

    @property
    def training(self) -> Training:
        return Training(self.shape, self.completions, self.prompt_len + self.completion_len, self.completion_len,
                        self.micro_batch)

    def quick(self) -> Grpo:
        return dataclasses.replace(self, prompt_len=16, completion_len=16)


GENERATION = {"G1": Generation("qwen3-0.6b", 8, 8, 128, 1024), "G2": Generation("qwen3-0.6b", 256, 1, 128, 512),
              "G3": Generation("qwen3-4b", 8, 8, 256, 4096)}
TRAINING = {"T1": Training("qwen3-0.6b", 64, 1152, None, 16), "T2": Training("qwen3-4b", 64, 4352, 4096, 4)}
# R3 keeps 90% of its optimizer state on the GPU and streams 10% (docs/MEMORY.md: the plan fits at 1%, 0.1 leaves
# 16 GiB of room in the training phase); L1 trains one 16,640-token completion per pass.
GRPO = {"R1": Grpo("qwen3-0.6b", 8, 8, 128, 1024, 16, None), "R2": Grpo("qwen3-4b", 8, 8, 256, 4096, 4, None),
        "R3": Grpo("qwen3-8b", 8, 8, 256, 2048, 4, 0.1), "L1": Grpo("qwen3-1.7b", 4, 4, 256, 16384, 1, None)}


def workload(table: dict, name: str, shape: str | None = None, quick: bool = False):
    """(the name its records go under, its sizes): `table[name]`, on `shape` when given, shrunk by `quick`."""
    work = table[name]
    key = name if shape in (None, work.shape) else f"{name}-{shape}"
    work = dataclasses.replace(work, shape=shape or work.shape)
    return key, work.quick() if quick else work


def shape_dict(shape: str, quick: bool = False) -> dict:
    """config.json's values of a shape (at the tiny width with `quick`)."""
    return {**SHAPES[shape], **TINY} if quick else dict(SHAPES[shape])


def model_config(shape: str, quick: bool = False):
    from barerl.config import ModelConfig

    return ModelConfig.from_dict(shape_dict(shape, quick), source=f"{shape} shape")


def hf_config_kwargs(shape: dict) -> dict:
    """`transformers.Qwen3Config` keyword arguments for a shape (pad 0 and eos 1, as the numbered tokenizer)."""
    return {k: v for k, v in shape.items() if k != "architectures"} | {"pad_token_id": 0, "eos_token_id": 1}


def decode_floor_seconds(cfg, g: Generation, bandwidth: float) -> float:
    """Reading all weights and every live token's K and V once per decode step, at `bandwidth` bytes/s."""
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    n = g.new_tokens
    context_tokens = g.sequences * (n * g.prompt_len + n * (n - 1) / 2)
    return (n * cfg.num_parameters() * 2 + context_tokens * kv_per_token) / bandwidth


def training_flops(cfg, t: Training) -> float:
    """6 x parameters x tokens + causal attention (recomputation is not useful work)."""
    L = t.seqlen
    attention = 3 * (4 * L**2 / 2 * cfg.head_dim * cfg.num_attention_heads) * cfg.num_hidden_layers
    return 6 * cfg.num_parameters() * t.sequences * L + attention * t.sequences


def training_utilisation(flops: float, seconds: float, rates: dict) -> dict:
    """A step's TFLOP/s and MFU over the measured matrix rate (`rates`: common.ceilings; {} on a CPU) and over
    the datasheet's, and the floor: the useful FLOP at the measured rate."""
    tflops = flops / seconds / 1e12
    measured = rates.get("matmul_tflops")
    return {"tflops": tflops, "useful_flop": flops, "mfu_measured": tflops / measured if measured else None,
            "mfu_spec": tflops / SPEC_BF16_TFLOPS, "floor_s": flops / (measured * 1e12) if measured else None}


def utilisation_words(u: dict) -> str:
    """'MFU x% of measured (y% of the 989 TFLOP/s spec)': training_utilisation's figures in words."""
    measured = f"MFU {u['mfu_measured']:.1%} of measured, " if u["mfu_measured"] is not None else ""
    return f"{measured}{u['mfu_spec']:.1%} of the {SPEC_BF16_TFLOPS:.0f} TFLOP/s spec"
