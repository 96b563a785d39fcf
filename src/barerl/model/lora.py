"""LoRA: the base weights frozen, low-rank adapters trained in a flat buffer of their own, applied on the fly.

Design decisions:
- peft's parametrisation: y = x W^T + (lora_alpha / r) (dropout(x) A^T) B^T with A (r, in) and B (out, r),
  B zero at the start and A kaiming-uniform, so adapters round-trip with peft and the optimizer moves what
  peft's moves; with `use_rslora` the scale is lora_alpha / sqrt(r) (rank-stabilised LoRA, peft's option).
- One flat buffer (`LoraWeights`) holds every adapter, with named views as `ParameterBuffer` has for the
  base, so the optimizer (fp32 master, moments, gradients, stochastic rounding, offload) runs over it as it
  is. The base keeps one copy (bf16 on the GPU), gets no gradient buffer and no optimizer state.
- Adapters follow the base's fused products. A layer has four sites: q/k/v (one product of h1), o_proj,
  gate/up (one product of h2) and down. A site's A matrices are stacked, (n r, in): one product for all its
  modules. Its B is one (out, n r) matrix, block-diagonal: module m's B on m's rows of the fused output and
  m's r columns, zeros elsewhere (an untargeted module's rows are all zero), so the second product is one
  GEMM that writes the fused output's layout (q's rows, then k's, then v's). The zeros stay zero: their
  gradient is cleared after each backward, so Adam's moments and updates there are zero as well. They cost
  (n - 1) / n of a fused site's B (0.6M numbers per Qwen3-8B layer at r = 16), for one product per site.
- The adapter enters as the base product's residual: delta = scale * u B^T (+ the layer's residual for
  o_proj and down), then y = x W^T + bias + delta with delta as cuBLASLt's C operand, so y is rounded once.
  The engine runs the very same products as the trainer (batch invariance holds as for the base) on the
  very buffer the optimizer rewrites in place: no merged copy, no sync, and CUDA graphs find the adapters at
  their fixed addresses.
- `AdaptedOps` stands in for the model's ops (`model.ops`, as recompute.py's stand-ins do, which wrap it in
  turn), so the layer code is unchanged and the adapters' products make the model's batch_invariant choice:
  a targeted projection is an `Adapted` (base view + its site), and the stand-in's `linear` /
  `linear_backward` add the low-rank path. The backward recomputes u = x A^T (a product of n r columns) instead of keeping it
  and asks the base product for its input's gradient only.
- Dropout (training only; the engine never drops) is drawn from a counter (the `dropout` op), a pure
  function of the pass's seed and the site, so recomputation under checkpointing redraws the same mask. A
  site's modules share the mask of their shared input, where peft draws one per module: the same
  expectation, and the A product stays one GEMM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from barerl.config import ConfigError, ModelConfig
from barerl.formats.safetensors import to_host
from barerl.model.checkpoint import copy_into
from barerl.model.weights import LayerView
from barerl.ops.ref.counter_rng import splitmix64

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_LINEAR = "all-linear"  # peft's name: every linear layer but the LM head
MODULE_PATHS = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
                "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
                "down_proj": "mlp.down_proj"}
# A layer's sites: the LayerView field of the base product and the modules it fuses, in its row order.
SITES = (("qkv", ("q_proj", "k_proj", "v_proj")), ("o_proj", ("o_proj",)), ("gate_up", ("gate_proj", "up_proj")),
         ("down", ("down_proj",)))


@dataclass(frozen=True)
class LoraConfig:
    """Which projections get adapters and how they are scaled (peft's LoraConfig names)."""

    r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] = (ALL_LINEAR,)
    use_rslora: bool = False

    def __post_init__(self):
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ConfigError(f"lora_r: must be a positive integer, got {self.r!r}")
        if not self.lora_alpha > 0:
            raise ConfigError(f"lora_alpha: must be > 0, got {self.lora_alpha!r}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"lora_dropout: must be in [0, 1), got {self.lora_dropout!r}")
        if not isinstance(self.use_rslora, bool):
            raise ConfigError(f"use_rslora: must be true or false, got {self.use_rslora!r}")
        object.__setattr__(self, "target_modules", resolve_target_modules(self.target_modules))

    @property
    def scale(self) -> float:
        """What multiplies B A: lora_alpha / r, or lora_alpha / sqrt(r) with rank-stabilised LoRA (an adapter's
        update then keeps its size as r grows)."""
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


def resolve_target_modules(names) -> tuple[str, ...]:
    """peft's target module names (or 'all-linear') -> the targeted modules in TARGET_MODULES order."""
    names = (names,) if isinstance(names, str) else tuple(names)
    if ALL_LINEAR in names:
        if len(names) > 1:
            raise ConfigError(f"lora_target_modules: '{ALL_LINEAR}' already names every linear layer, got "
                              f"{list(names)}")
        return TARGET_MODULES
    unknown = sorted(set(names) - set(TARGET_MODULES))
    if unknown or not names:
        raise ConfigError(f"lora_target_modules: must be among {list(TARGET_MODULES)} or '{ALL_LINEAR}', got "
                          f"{list(names)}")
    return tuple(m for m in TARGET_MODULES if m in names)


def module_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each projection, as Hugging Face stores its weight."""
    C, I = cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": (cfg.q_size, C), "k_proj": (cfg.kv_size, C), "v_proj": (cfg.kv_size, C),
            "o_proj": (C, cfg.q_size), "gate_proj": (I, C), "up_proj": (I, C), "down_proj": (C, I)}


def lora_offsets(cfg: ModelConfig, lora: LoraConfig) -> dict[str, tuple[int, tuple[int, ...]]]:
    """name -> (element offset, shape) of each site's A (n r, in) and B (out, n r), layer by layer."""
    shapes, offsets, pos = module_shapes(cfg), {}, 0
    for i in range(cfg.num_hidden_layers):
        for field, modules in SITES:
            targeted = [m for m in modules if m in lora.target_modules]
            if not targeted:
                continue
            rank, fan_in, out = len(targeted) * lora.r, shapes[modules[0]][1], sum(shapes[m][0] for m in modules)
            for name, shape in ((f"model.layers.{i}.{field}.lora_A", (rank, fan_in)),
                                (f"model.layers.{i}.{field}.lora_B", (out, rank))):
                offsets[name] = (pos, shape)
                pos += math.prod(shape)
    return offsets


def lora_buffer_size(cfg: ModelConfig, lora: LoraConfig) -> int:
    """Elements of the adapters' flat buffer (the block-diagonal B's zeros included)."""
    return sum(math.prod(shape) for _, shape in lora_offsets(cfg, lora).values())


def lora_config_of(train) -> LoraConfig | None:
    """The adapters a training config's `lora_r` asks for (None: it trains every parameter, or takes its
    adapters from a PEFT folder)."""
    if not train.lora_r:
        return None
    return LoraConfig(train.lora_r, train.lora_alpha, train.lora_dropout, train.lora_target_modules,
                      train.use_rslora)


class Site:
    """One site's adapters as views of a flat buffer: A (n r, in) stacked, B (out, n r) block-diagonal."""

    def __init__(self, A, B, rows: dict[str, slice], targeted: tuple[str, ...], r: int):
        self.A, self.B, self.targeted = A, B, targeted
        self._rows = rows  # every module of the fused product -> its rows of the output
        self._columns = {m: slice(j * r, (j + 1) * r) for j, m in enumerate(targeted)}
        self._off_diagonal = [(rows[m], self._columns[t]) for m in rows for t in targeted if t != m]

    def module_A(self, module: str):
        """peft's lora_A of `module`: (r, in)."""
        return self.A[self._columns[module]]

    def module_B(self, module: str):
        """peft's lora_B of `module`: (out_m, r), its block of the diagonal (a strided view)."""
        return self.B[self._rows[module], self._columns[module]]

    def clear_off_diagonal(self) -> None:
        for rows, columns in self._off_diagonal:
            self.B[rows, columns] = 0


class LoraWeights:
    """Every adapter of a model in one flat array (NumPy or CuPy) with named views, laid out by
    `lora_offsets`. Used for the working adapters, their gradients, the fp32 master and the moments alike.

    `layers[i]` is a LayerView holding the layer's `Site`s (None where nothing is targeted, and for every
    norm and bias); `embed`, `final_norm` and `lm_head` are None: as a gradient buffer it gives the frozen
    base no gradient."""

    def __init__(self, cfg: ModelConfig, lora: LoraConfig, flat):
        self.cfg, self.lora, self.flat = cfg, lora, flat
        self.offsets = lora_offsets(cfg, lora)
        total = lora_buffer_size(cfg, lora)
        if flat.ndim != 1 or flat.shape[0] != total:
            raise ValueError(f"LoRA buffer has shape {flat.shape}, these adapters need ({total},)")
        self.layers = [self._layer(i) for i in range(cfg.num_hidden_layers)]
        self.embed = self.final_norm = self.lm_head = None

    @classmethod
    def zeros(cls, cfg: ModelConfig, lora: LoraConfig, xp, dtype) -> LoraWeights:
        return cls(cfg, lora, xp.zeros(lora_buffer_size(cfg, lora), dtype=dtype))

    def with_flat(self, flat) -> LoraWeights:
        """The same layout over another flat array (the optimizer's master, moments and gradients)."""
        return LoraWeights(self.cfg, self.lora, flat)

    def _view(self, name: str):
        off, shape = self.offsets[name]
        return self.flat[off : off + math.prod(shape)].reshape(shape)

    def _layer(self, i: int) -> LayerView:
        shapes, sites = module_shapes(self.cfg), {}
        for field, modules in SITES:
            targeted = tuple(m for m in modules if m in self.lora.target_modules)
            if targeted:
                starts = np.cumsum([0] + [shapes[m][0] for m in modules])
                rows = {m: slice(int(a), int(b)) for m, a, b in zip(modules, starts[:-1], starts[1:])}
                p = f"model.layers.{i}.{field}.lora_"
                sites[field] = Site(self._view(p + "A"), self._view(p + "B"), rows, targeted, self.lora.r)
        return LayerView(input_norm=None, qkv=sites.get("qkv"), qkv_bias=None, q_norm=None, k_norm=None,
                         o_proj=sites.get("o_proj"), post_norm=None, gate_up=sites.get("gate_up"),
                         down=sites.get("down"))

    def sites(self):
        """(layer index, site field, Site) of every site with adapters."""
        for i, layer in enumerate(self.layers):
            for field, _ in SITES:
                if getattr(layer, field) is not None:
                    yield i, field, getattr(layer, field)

    def peft_tensors(self) -> list[tuple[str, object]]:
        """(name without peft's `base_model.model.` prefix, view) of every module's lora_A and lora_B."""
        tensors = []
        for i, _, site in self.sites():
            for m in site.targeted:
                p = f"model.layers.{i}.{MODULE_PATHS[m]}.lora_"
                tensors += [(p + "A.weight", site.module_A(m)), (p + "B.weight", site.module_B(m))]
        return tensors


@dataclass(frozen=True)
class Adapted:
    """A projection with its adapters: the layer code's weight where LoRA targets it (see AdaptedOps)."""

    base: object  # (out, in) the frozen base weight
    site: Site  # the working adapters
    scale: float  # LoraConfig.scale
    stream: int  # the site's dropout stream: 4 * layer + site index


class LoraAdapters:
    """A model's adapters: their config, the working buffer (the model's dtype and device) and the layers the
    layer code reads (the base LayerViews with each targeted projection `Adapted`)."""

    def __init__(self, config: LoraConfig, weights: LoraWeights, base_layers: list[LayerView]):
        self.config, self.weights = config, weights
        self.layers = [_adapted_layer(i, base, adapters, config.scale)
                       for i, (base, adapters) in enumerate(zip(base_layers, weights.layers))]

    def ops(self, ops, dropout_seed: int | None = None) -> AdaptedOps:
        """The stand-in for the model's `ops` in the layer code; dropout only with a seed (a training pass)."""
        p = self.config.lora_dropout
        return AdaptedOps(ops, (p, dropout_seed) if p > 0 and dropout_seed is not None else None)


def _adapted_layer(i: int, base: LayerView, adapters: LayerView, scale: float) -> LayerView:
    fields = {}
    for index, (field, _) in enumerate(SITES):
        site = getattr(adapters, field)
        fields[field] = getattr(base, field) if site is None else Adapted(getattr(base, field), site, scale,
                                                                            4 * i + index)
    return LayerView(input_norm=base.input_norm, qkv_bias=base.qkv_bias, q_norm=base.q_norm, k_norm=base.k_norm,
                     post_norm=base.post_norm, **fields)


class AdaptedOps:
    """A model's ops (`model.ops`), with the low-rank path of each `Adapted` projection added to its product
    (forward) and its gradient taken into the site's gradients (backward); everything else passes through."""

    def __init__(self, ops, dropout: tuple[float, int] | None = None):
        self._ops, self._dropout = ops, dropout  # (p, seed) of a training pass

    def __getattr__(self, name: str):
        return getattr(self._ops, name)

    def _input(self, x, w: Adapted):
        if self._dropout is None:
            return x
        p, seed = self._dropout
        return self._ops.dropout(x, p, seed, w.stream)

    def linear(self, x, w, bias=None, residual=None):
        """x W^T + bias + residual, plus scale * (dropout(x) A^T) B^T where w is Adapted."""
        if not isinstance(w, Adapted):
            return self._ops.linear(x, w, bias, residual)
        u = self._ops.linear(self._input(x, w), w.site.A)  # (T, n r)
        delta = self._ops.linear(u, w.site.B, residual=residual, scale=w.scale)  # the fused output's layout
        return self._ops.linear(x, w.base, bias, residual=delta)

    def linear_backward(self, dy, x, w, dw, dbias=None):
        """Gradient of `linear`: into the site's gradients `dw` (a Site) where w is Adapted, the base's none."""
        if not isinstance(w, Adapted):
            return self._ops.linear_backward(dy, x, w, dw, dbias)
        x_in = self._input(x, w)
        u = self._ops.linear(x_in, w.site.A)  # recomputed: n r columns
        du = self._ops.linear_backward(dy, u, w.site.B, dw.B, scale=w.scale)
        dw.clear_off_diagonal()
        dx_adapter = self._ops.linear_backward(du, x_in, w.site.A, dw.A)
        if self._dropout is not None:
            dx_adapter = self._ops.dropout_backward(dx_adapter, *self._dropout, w.stream)
        return self._ops.linear_backward(dy, x, w.base, None, dbias, residual_grad=dx_adapter)


def add_lora(model, config: LoraConfig, seed: int = 0) -> LoraAdapters:
    """Give `model` fresh adapters (A kaiming-uniform as peft's, B zero), in its dtype and on its device;
    from then on its forward passes (training and the engine's) apply them. Attach them before an engine
    captures CUDA graphs of the model (LLM(model) after this call)."""
    if model.lora is not None:
        raise ValueError("the model has LoRA adapters already")
    host = LoraWeights.zeros(model.cfg, config, np, np.float32)
    rng = np.random.default_rng(seed)
    for _, _, site in host.sites():
        bound = 1.0 / math.sqrt(site.A.shape[1])  # kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))
        site.A[...] = rng.uniform(-bound, bound, size=site.A.shape)
    return attach(model, host)


def attach(model, host: LoraWeights) -> LoraAdapters:
    """Attach adapters given on the host (fp32 NumPy) to `model`, cast to its dtype and moved to its device."""
    flat = host.flat.astype(model.dtype)
    weights = host.with_flat(flat if model.xp is np else model.xp.asarray(flat))
    model.lora = LoraAdapters(host.lora, weights, model.params.layers)
    return model.lora


def merge_lora(model) -> None:
    """Fold the adapters into the base weights (W += scale * B A per module, in fp32, rounded once) and
    detach them: the model is a plain one again, which `save_checkpoint` writes in Hugging Face format."""
    adapters = model.lora
    if adapters is None:
        raise ValueError("the model has no LoRA adapters to merge")
    host = adapters.weights.with_flat(to_host(adapters.weights.flat).astype(np.float32))
    shapes, scale = module_shapes(model.cfg), adapters.config.scale
    for i, field, site in host.sites():
        base = getattr(model.params.layers[i], field)
        start = 0
        for m in dict(SITES)[field]:
            rows = slice(start, start + shapes[m][0])
            start = rows.stop
            if m in site.targeted:
                merged = to_host(base[rows]).astype(np.float32) + scale * (site.module_B(m) @ site.module_A(m))
                copy_into(base[rows], merged)
    model.lora = None


def training_dropout_seed(run_seed: int, step: int, micro_batch: int) -> int:
    """The dropout seed of one training pass: a pure function of the run's seed, the optimizer step and the
    micro-batch, so a resumed run draws the same masks."""
    key = np.array([(step << 20) | micro_batch], dtype=np.uint64)
    return int(splitmix64(np.uint64(run_seed), key)[0])
