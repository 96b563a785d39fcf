"""The whole model, training step and engine on the CUDA backend against the CPU reference backend.

fp32 on the GPU must match the reference to rounding; bf16 within bf16 tolerance. Tiny random Qwen3/Qwen2
models (GQA, q/k norm, qkv bias) and a SmolLM2-like Llama (GQA ratio 3, tied head), ragged packed batches.
"""

import numpy as np
import pytest

from barerl.config import ModelConfig
from barerl.formats.safetensors import resolve_dtype
from barerl.model.model import Model, PackedBatch
from barerl.model.weights import ParameterBuffer

pytestmark = pytest.mark.gpu


ARCHS = {  # name: architecture, query heads, kv heads, tied head
    "qwen3": ("Qwen3ForCausalLM", 4, 2, True),
    "qwen2": ("Qwen2ForCausalLM", 4, 2, False),
    "llama_gqa3": ("LlamaForCausalLM", 6, 2, True),  # SmolLM2's shape: 9 query heads over 3 kv heads
}


def tiny_config(name="qwen3", head_dim=64) -> ModelConfig:
    arch, heads, kv_heads, tied = ARCHS[name]
    return ModelConfig.from_dict({
        "architectures": [arch], "vocab_size": 300, "hidden_size": heads * head_dim // 2,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "rope_theta": 10000.0,
        "tie_word_embeddings": tied, "max_position_embeddings": 512,
    })


def pair(cfg, dtype="float32", seed=0):
    """The same random weights on the CPU (fp32 reference) and on the GPU (dtype)."""
    import cupy

    cpu = Model.random(cfg, "cpu", "float32", seed=seed)
    host = cpu.params.flat.astype(resolve_dtype(dtype))
    gpu = Model(cfg, ParameterBuffer(cfg, cupy.asarray(host)), "cuda")
    return cpu, gpu


def batch(cfg, lengths=(37, 5, 130, 64), seed=1):
    rng = np.random.default_rng(seed)
    return PackedBatch.from_sequences([rng.integers(0, cfg.vocab_size, n).tolist() for n in lengths])


def mean_ce(xp, num_tokens):
    def loss_fn(logp, entropy):
        return float(-logp.sum()) / num_tokens, xp.full(logp.shape, -1.0 / num_tokens, np.float32), {}

    return loss_fn


def rel(a, b) -> float:
    a = np.asarray(a.get() if hasattr(a, "get") else a, np.float64)
    b = np.asarray(b.get() if hasattr(b, "get") else b, np.float64)
    assert np.isfinite(a).all()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 3e-2)])
def test_logprobs_and_gradients_match_reference(arch, dtype, tol):
    import cupy

    cfg = tiny_config(arch)
    cpu, gpu = pair(cfg, dtype)
    b = batch(cfg)
    lp_cpu, _ = cpu.logprobs(b)
    lp_gpu, _ = gpu.logprobs(b)
    assert rel(lp_gpu, lp_cpu) < tol
    g_cpu, g_gpu = cpu.zeros_like_params(), gpu.zeros_like_params()
    loss_cpu, _ = cpu.forward_backward(b, mean_ce(np, b.num_tokens), g_cpu, checkpoint=True)
    loss_gpu, _ = gpu.forward_backward(b, mean_ce(cupy, b.num_tokens), g_gpu, checkpoint=True)
    assert abs(loss_gpu - loss_cpu) / loss_cpu < tol
    worst = {name: rel(g_gpu[name], g) for name, g in g_cpu}
    bad = {n: e for n, e in worst.items() if e > 10 * tol}
    assert not bad, bad


def test_training_step_matches_reference():
    import cupy

    from barerl.train.optimizer import AdamW

    cfg = tiny_config()
    cpu, gpu = pair(cfg, "float32")
    b = batch(cfg)
    for model, xp in ((cpu, np), (gpu, cupy)):
        opt = AdamW(model.params, model.backend, weight_decay=0.1)
        for _ in range(2):
            opt.zero_grad()
            model.forward_backward(b, mean_ce(xp, b.num_tokens), opt.grads)
            opt.step(1e-3)
    assert rel(gpu.params.flat, cpu.params.flat) < 1e-5


@pytest.mark.parametrize("arch", list(ARCHS))
def test_engine_greedy_equals_reference_and_bf16_logprobs_close(arch):
    from barerl import LLM, SamplingParams

    cfg = tiny_config(arch)
    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 7 * i))} for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=True)
    outs = {}
    for name, dtype in (("cpu", "float32"), ("cuda", "float32"), ("cuda_bf16", "bfloat16")):
        cpu, gpu = pair(cfg, dtype)
        model = cpu if name == "cpu" else gpu
        llm = LLM(model, None, device=model.device, num_kv_blocks=128, max_model_len=256)
        outs[name] = llm.generate(prompts, params, use_tqdm=False)
    for ref, got in zip(outs["cpu"], outs["cuda"]):
        assert got.outputs[0].token_ids == ref.outputs[0].token_ids
    for ref, got in zip(outs["cpu"], outs["cuda_bf16"]):
        a, b = ref.outputs[0], got.outputs[0]
        same = [i for i in range(len(a.token_ids)) if a.token_ids[: i + 1] == b.token_ids[: i + 1]]
        assert same, "bf16 diverged at the first token"
        diff = np.abs(np.array(a.logprobs)[same] - np.array(b.logprobs)[same])
        assert diff.max() < 0.1, diff.max()


def test_gradients_match_torch_autograd_on_the_gpu_in_bf16():
    """A Qwen3-shaped model (q/k norms, GQA, head_dim 128, tied head) in bf16: every parameter's gradient of
    the mean token cross-entropy against transformers + torch autograd on the same GPU."""
    import cupy
    import torch
    import transformers

    config = transformers.Qwen3Config(vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                                      tie_word_embeddings=True, max_position_embeddings=1024)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    hf = hf.to("cuda", torch.bfloat16)
    cfg = ModelConfig.from_dict(hf.config.to_dict())
    host = ParameterBuffer.zeros(cfg, np, resolve_dtype("bfloat16"))
    state = hf.state_dict()
    for name, view in host:
        view[...] = state[name].float().cpu().numpy()
    ours = Model(cfg, ParameterBuffer(cfg, cupy.asarray(host.flat)), "cuda")
    seqs = [np.random.default_rng(i).integers(0, cfg.vocab_size, n).tolist() for i, n in enumerate((200, 37, 311))]
    num_targets = sum(len(s) - 1 for s in seqs)

    total = 0
    for seq in seqs:
        ids = torch.tensor([seq], device="cuda")
        logp = torch.log_softmax(hf(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])
        total = total - logp.sum()
    (total / num_targets).backward()

    b = PackedBatch.from_sequences(seqs)
    mask = cupy.asarray(b.loss_mask)

    def loss_fn(logp, entropy):
        return float(-(logp * mask).sum()) / num_targets, -mask / num_targets, {}

    grads = ours.zeros_like_params()
    ours.forward_backward(b, loss_fn, grads, checkpoint=True)
    worst = {}
    for name, p in hf.named_parameters():
        worst[name] = rel(grads[name], p.grad.float().cpu().numpy())
    bad = {n: e for n, e in worst.items() if e > 5e-2}
    assert not bad, bad
