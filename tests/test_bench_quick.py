"""Every bench script's CPU smoke test (`--quick`: a tiny model, a few tokens), so that none rots: each runs in
its own process as on the GPU machine and must write its JSON record; then run_all.py files and reports them.
Peers that are not installed here (vLLM, TRL) are skipped; the op-level probes need a GPU and are checked
for their imports and command line (`--help`)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
OP_PROBES = ("bench_kernels.py", "bench_gemm.py", "bench_decode_kernels.py", "profile_decode.py",
             "profile_attention.py", "batch_invariance.py")


def bench(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{script} {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def needs(*modules: str):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")


def record(out: Path, name: str) -> dict:
    data = json.loads((out / name).read_text())
    assert data["metrics"], name
    return data


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("records")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("model") / "tiny"
    bench("make_model.py", str(folder), "--quick")
    return folder


def test_generate_barerl(records):
    bench("generate_barerl.py", "--quick", "--workloads", "G1", "--out", str(records))
    metrics = record(records, "G1-barerl.json")["metrics"]
    assert metrics["new_tok_s"] > 0 and metrics["cold_start_first_token_s"] > 0


@needs("torch", "transformers")
def test_generate_transformers(records):
    """The static-cache setting (on a CPU transformers does not compile; the default setting differs by one argument)."""
    bench("generate_transformers.py", "--quick", "--workloads", "G1", "--out", str(records))
    assert record(records, "G1-transformers-compiled.json")["metrics"]["new_tok_s"] > 0


@needs("vllm")
def test_generate_vllm(records, tiny_model):
    bench("generate_vllm.py", "--quick", "--workloads", "G1", "--model", str(tiny_model), "--out", str(records))
    assert record(records, "G1-vllm.json")["metrics"]["new_tok_s"] > 0


def test_train_barerl(records):
    bench("train_barerl.py", "--quick", "--keep", "attention", "none", "--out", str(records))
    for name in ("T1-barerl-keep-attention.json", "T1-barerl-keep-none.json"):
        assert record(records, name)["metrics"]["step_s"] > 0


@needs("torch", "transformers")
def test_train_torch(records):
    """Selective checkpointing that keeps attention: the row with the most of torch's machinery."""
    bench("train_torch.py", "--quick", "--rows", "attention", "--out", str(records))
    assert record(records, "T1-torch-attention.json")["metrics"]["step_s"] > 0


def test_train_torch_refuses_a_bad_row():
    done = subprocess.run([sys.executable, str(BENCH / "train_torch.py"), "--rows", "sometimes"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "bad row 'sometimes'" in done.stderr


def test_grpo_barerl(records):
    bench("grpo_barerl.py", "--quick", "--steps", "2", "--out", str(records))
    metrics = record(records, "R1-barerl.json")["metrics"]
    assert len(metrics["step_s_each"]) == 2 and metrics["cold_start_first_step_end_s"] > 0
    assert metrics["mismatch_max"] < 1e-4  # fp32 on the CPU: the engine's and the trainer's log-probs agree


def test_bench_lora(records):
    bench("bench_lora.py", "--quick", "--steps", "2", "--out", str(records))
    metrics = record(records, "R1-barerl-lora-r16.json")["metrics"]
    assert len(metrics["step_s_each"]) == 2 and metrics["mismatch_max"] < 1e-4
    assert 0 < metrics["plan_train_gib"] < 0.01  # the tiny model's plan, LoRA's


@needs("trl", "datasets")
def test_grpo_trl_without_vllm(records, tiny_model):
    bench("grpo_trl.py", "--quick", "--vllm", "off", "--steps", "1", "--model", str(tiny_model), "--out",
          str(records))
    assert record(records, "R1-trl.json")["metrics"]["step_s"] > 0


def test_reward_parity(tmp_path, tiny_model):
    bench("reward_parity.py", "run", "--system", "barerl", "--task", "demo", "--model", str(tiny_model), "--steps",
          "1", "--batch", "16", "--device", "cpu", "--out", str(tmp_path))
    bench("reward_parity.py", "plot", "--out", str(tmp_path))
    assert (tmp_path / "reward_parity.png").exists()


def test_profile_train_step():
    assert "micro-batch" in bench("profile_train_step.py", "--quick").stdout


@pytest.mark.parametrize("script", OP_PROBES)
def test_op_probe_command_line(script):
    assert "usage" in bench(script, "--help").stdout


def test_record_and_report(records, tmp_path):
    """Runs after the scripts above (file order): their records filed as runs, then the table and chart."""
    if not list(records.glob("*.json")):
        pytest.skip("no records written")
    results = tmp_path / "results"
    bench("run_all.py", "record", str(records), "--commit", "abc1234", "--results", str(results))
    table = bench("run_all.py", "report", "--results", str(results)).stdout
    assert "| G1 |" in table and (results / "summary.png").exists()
    history = (results / "R1" / "history.csv").read_text().splitlines()
    assert history[0].startswith("date,commit,run") and len(history) == 2


def test_gpu_run_usage():
    done = subprocess.run(["bash", str(BENCH / "gpu_run.sh")], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "--to DIR" in done.stdout
