"""Models named by their Hugging Face Hub id (ORG/NAME): taken from huggingface_hub's cache, with the Hub
unreachable (no network at test time), as a model folder is; clear errors when the cache or the library lacks it."""

import shutil
import sys

import numpy as np
import pytest

from barerl.formats import CheckpointError
from barerl.formats.paths import hub_snapshot, load_config, resolve_model_path
from barerl.model.checkpoint import load_checkpoint
from barerl.model.lora import LoraConfig, add_lora
from barerl.model.model import Model
from barerl.model.peft_format import read_adapter, save_adapter

hub_constants = pytest.importorskip("huggingface_hub.constants")

REPO_ID = "barerl-tests/tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty Hub cache in tmp_path, the Hub switched off; yields the folder a repository's snapshot goes to."""
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    hub_snapshot.cache_clear()
    yield lambda repo_id: tmp_path / "hub" / f"models--{repo_id.replace('/', '--')}"
    hub_snapshot.cache_clear()


def cache_snapshot(repo, folder):
    """`folder`'s files as the main revision of `repo` (a repository's folder in the Hub's cache)."""
    shutil.copytree(folder, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return repo / "snapshots" / COMMIT


def test_a_hub_id_loads_the_cached_snapshot(tiny_hf_model, tmp_path, offline_hub):
    folder, _ = tiny_hf_model("qwen3", tmp_path / "saved")
    snapshot = cache_snapshot(offline_hub(REPO_ID), folder)
    assert resolve_model_path(REPO_ID) == str(snapshot)
    assert load_config(REPO_ID) == load_config(folder)
    model = Model.from_pretrained(REPO_ID)
    np.testing.assert_array_equal(model.params.flat, load_checkpoint(folder)[1].flat)


def test_a_hub_adapter_loads_over_its_hub_base(tiny_hf_model, tmp_path, offline_hub):
    folder, _ = tiny_hf_model("qwen3", tmp_path / "saved")
    cache_snapshot(offline_hub(REPO_ID), folder)
    adapters = add_lora(Model.from_pretrained(folder), LoraConfig(r=2, target_modules=("q_proj",)), seed=1)
    save_adapter(tmp_path / "adapter", adapters, base_model=REPO_ID)
    cache_snapshot(offline_hub("barerl-tests/adapter"), tmp_path / "adapter")
    model = Model.from_pretrained("barerl-tests/adapter")
    np.testing.assert_array_equal(model.lora.weights.flat, adapters.weights.flat)
    assert read_adapter("barerl-tests/adapter")[0] == adapters.config


def test_a_hub_id_the_cache_lacks_is_named_in_the_error(offline_hub):
    with pytest.raises(CheckpointError, match=f"{REPO_ID}: no such file or folder, nor a model the Hugging Face "
                                              "Hub gives: LocalEntryNotFoundError"):
        Model.from_pretrained(REPO_ID)


def test_without_huggingface_hub_the_error_names_the_extra(offline_hub, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(CheckpointError, match=r"pip install 'barerl\[hub\]'"):
        load_config(REPO_ID)


def test_a_local_path_shaped_like_a_hub_id_stays_local(tmp_path, monkeypatch, offline_hub):
    (tmp_path / "runs" / "base").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("runs/base") == "runs/base"
    assert resolve_model_path("runs/base/model.gguf") == "runs/base/model.gguf"  # not ORG/NAME: a path
    assert resolve_model_path("models/missing.gguf") == "models/missing.gguf"  # a file's name: never the Hub
