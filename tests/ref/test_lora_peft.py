"""LoRA against transformers + peft (torch CPU, fp32) on tiny random models of each family: the adapters'
gradients, logits through PEFT's format both ways (in: peft's file into barerl; out: barerl's file into
`PeftModel.from_pretrained`), `barerl merge` against peft's `merge_and_unload`, and what the reader refuses."""

import json

import numpy as np
import pytest
import torch

from barerl.model.batch import PackedBatch
from barerl.model.lora import LoraConfig, add_lora
from barerl.model.model import Model
from barerl.model.peft_format import ADAPTER_CONFIG, load_adapter, save_adapter

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

PARTIAL = ("q_proj", "v_proj", "up_proj")  # one module of each fused site left out, one unfused site left out


def peft_model(tiny_hf_model, family, tmp_path, targets, seed=1, use_rslora=False):
    """(the base's folder, a peft model of it with random lora_A and lora_B, r 4, lora_alpha 8); targets:
    module names, "all-linear" or a pattern of peft's (matched against whole module paths)."""
    folder, hf = tiny_hf_model(family, tmp_path)
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, use_rslora=use_rslora,
                             target_modules=targets if isinstance(targets, str) else list(targets))
    return folder, peft.get_peft_model(hf, config)


def barerl_with_adapter(folder, pm, tmp_path) -> Model:
    pm.save_pretrained(tmp_path / "peft-adapter")
    model = Model.from_pretrained(folder)
    load_adapter(model, tmp_path / "peft-adapter")
    return model


def logits(model: Model, seq):
    h, _ = model.hidden_states(PackedBatch.from_sequences([seq]))
    return model.ops.lm_head_logits(h, model.params.lm_head)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def peft_name(name: str) -> str:
    return "base_model.model." + name


@pytest.mark.parametrize("targets,checkpoint", [("all-linear", True), (PARTIAL, False)])
def test_adapter_gradients_match_peft(tiny_hf_model, tiny_hf_family, tmp_path, targets, checkpoint):
    folder, pm = peft_model(tiny_hf_model, tiny_hf_family, tmp_path, targets)
    model = barerl_with_adapter(folder, pm, tmp_path)
    rng = np.random.default_rng(2)
    seqs = [rng.integers(0, model.cfg.vocab_size, n).tolist() for n in (13, 29, 5)]
    total = sum(-torch.log_softmax(pm(torch.tensor([s])).logits[0, :-1], -1)
                .gather(1, torch.tensor(s[1:])[:, None]).sum() for s in seqs)
    count = sum(len(s) - 1 for s in seqs)
    (total / count).backward()
    ref = {n.replace(".default", ""): p.grad.numpy() for n, p in pm.named_parameters() if p.requires_grad}

    batch = PackedBatch.from_sequences(seqs)
    mask = batch.loss_mask
    grads = model.lora.weights.with_flat(np.zeros_like(model.lora.weights.flat))
    loss, _ = model.forward_backward(batch, lambda lp, _: (float(-(lp * mask).sum() / count), -mask / count, {}),
                                     grads, checkpoint=checkpoint)
    assert abs(loss - total.item() / count) < 1e-5 * loss
    ours = dict(grads.peft_tensors())
    assert sorted(map(peft_name, ours)) == sorted(ref)
    errors = {name: rel_err(g, ref[peft_name(name)]) for name, g in ours.items()}
    assert max(errors.values()) < 1e-4, errors
    for _, _, site in grads.sites():  # the block-diagonal B's zeros got no gradient
        for m in site.targeted:
            site.module_B(m)[...] = 0
        assert not site.B.any()


def test_a_peft_adapter_gives_peft_logits_in_training_and_in_the_engine(tiny_hf_model, tiny_hf_family, tmp_path):
    folder, pm = peft_model(tiny_hf_model, tiny_hf_family, tmp_path, "all-linear")
    model = barerl_with_adapter(folder, pm, tmp_path)
    seq = np.random.default_rng(3).integers(0, model.cfg.vocab_size, 37).tolist()
    with torch.no_grad():
        ref = pm(torch.tensor([seq])).logits[0].numpy()
    assert rel_err(logits(model, seq), ref) < 1e-5
    cache = model.allocate_kv_cache(4, 16)
    engine = model.forward_paged(np.array(seq, np.int32), np.arange(37, dtype=np.int32), np.array([0, 37], np.int32),
                                 np.array([37], np.int32), np.arange(4, dtype=np.int32)[None],
                                 np.arange(37, dtype=np.int32), cache)
    assert rel_err(engine[0], ref[-1]) < 1e-5


@pytest.mark.parametrize("targets,use_rslora", [(PARTIAL, True), (r".*\.(q_proj|down_proj)", False)])
def test_peft_options_give_peft_logits(tiny_hf_model, tmp_path, targets, use_rslora):
    """rsLoRA (scale lora_alpha / sqrt(r)) and target_modules as a pattern."""
    folder, pm = peft_model(tiny_hf_model, "qwen3", tmp_path, targets, use_rslora=use_rslora)
    model = barerl_with_adapter(folder, pm, tmp_path)
    assert model.lora.config.scale == (8 / 2 if use_rslora else 8 / 4)
    seq = np.random.default_rng(5).integers(0, model.cfg.vocab_size, 23).tolist()
    with torch.no_grad():
        ref = pm(torch.tensor([seq])).logits[0].numpy()
    assert rel_err(logits(model, seq), ref) < 1e-5


def test_a_pattern_that_leaves_layers_out_is_refused(tiny_hf_model, tmp_path):
    folder, pm = peft_model(tiny_hf_model, "qwen3", tmp_path, r".*layers\.0\..*q_proj")
    pm.save_pretrained(tmp_path / "adapter")
    with pytest.raises(ValueError, match="some layers only"):
        load_adapter(Model.from_pretrained(folder), tmp_path / "adapter")


@pytest.mark.parametrize("use_rslora", [False, True])
def test_a_barerl_adapter_loads_in_peft_with_barerl_logits(tiny_hf_model, tmp_path, use_rslora):
    folder, _ = tiny_hf_model("qwen2", tmp_path)  # q/k/v biases: frozen, under the adapters
    model = Model.from_pretrained(folder)
    adapters = add_lora(model, LoraConfig(r=4, lora_alpha=6, target_modules=("q_proj", "k_proj", "o_proj",
                                                                             "down_proj"), use_rslora=use_rslora),
                        seed=3)
    for _, _, site in adapters.weights.sites():  # as if trained: B is zero at the start
        for m in site.targeted:
            site.module_B(m)[...] = np.random.default_rng(4).normal(0, 0.1, site.module_B(m).shape)
    save_adapter(tmp_path / "ours", adapters, base_model=str(folder))
    saved = json.loads((tmp_path / "ours" / ADAPTER_CONFIG).read_text())
    assert saved["base_model_name_or_path"] == str(folder) and saved["r"] == 4 and saved["lora_alpha"] == 6
    assert saved["use_rslora"] is use_rslora
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").float()
    pm = peft.PeftModel.from_pretrained(hf, tmp_path / "ours").eval()
    seq = list(range(1, 50))
    with torch.no_grad():
        ref = pm(torch.tensor([seq])).logits[0].numpy()
    assert rel_err(logits(model, seq), ref) < 1e-5


@pytest.mark.parametrize("use_rslora", [False, True])
def test_merge_command_writes_what_peft_merges(tiny_hf_model, tmp_path, use_rslora):
    from barerl.cli import main

    folder, pm = peft_model(tiny_hf_model, "qwen3", tmp_path, "all-linear", use_rslora=use_rslora)
    pm.save_pretrained(tmp_path / "adapter")
    assert main(["merge", "--model", str(folder), "--adapter", str(tmp_path / "adapter"), "--output",
                 str(tmp_path / "merged")]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", attn_implementation="eager")
    seq = torch.tensor([list(range(2, 40))])
    with torch.no_grad():
        ref = pm.merge_and_unload()(seq).logits[0].numpy()
        assert rel_err(merged.float()(seq).logits[0].numpy(), ref) < 1e-5


@pytest.mark.parametrize("field,value,message", [
    ("use_dora", True, "use_dora"), ("rank_pattern", {"q_proj": 8}, "rank_pattern"),
    ("target_modules", ["q_proj", "lm_head"], "lm_head"),
    ("bias", "all", "bias"), ("peft_type", "IA3", "LORA"),
])
def test_the_reader_refuses_what_it_would_compute_wrongly(tiny_hf_model, tmp_path, field, value, message):
    folder, pm = peft_model(tiny_hf_model, "llama3", tmp_path, PARTIAL)
    pm.save_pretrained(tmp_path / "adapter")
    path = tmp_path / "adapter" / ADAPTER_CONFIG
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    with pytest.raises(ValueError, match=message):
        load_adapter(Model.from_pretrained(folder), tmp_path / "adapter")
