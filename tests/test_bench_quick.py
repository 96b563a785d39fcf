"""Every bench script's CPU smoke test (`--quick`: a tiny model, a few tokens), so that none rots: each runs in
its own process as on the GPU machine and must write its JSON record, for every workload preset (G1-G3, T1-T2,
R1-R3, L1) and with `--shape`; then run_all.py files and reports them, a run that did not fit among them. Peers
that are not installed here (vLLM, TRL) are skipped; the op-level probes need a GPU and are checked for their
imports and command line (`--help`). The floors of shapes.py are checked against shared/WORKLOADS.md's."""

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


@pytest.fixture
def bench_modules(monkeypatch):
    """bench/ importable, as its scripts see it."""
    monkeypatch.syspath_prepend(str(BENCH))


# shared/WORKLOADS.md's floors on an H200, at 4.3 TB/s and 790 TFLOP/s: new tok/s, or seconds
WORKLOADS_MD = {"G1": 46.7e3, "G2": 88e3, "G3": 9.2e3, "T1": 0.37, "T2": 9.9, "R1": 1.8, "R2": 38, "R3": 23, "L1": 78}


def test_floors_are_those_of_the_workloads(bench_modules):
    import shapes

    bandwidth, rate = 4.3e12, 790e12
    for name, g in shapes.GENERATION.items():
        seconds = shapes.decode_floor_seconds(shapes.model_config(g.shape), g, bandwidth)
        assert g.sequences * g.new_tokens / seconds == pytest.approx(WORKLOADS_MD[name], rel=0.01), name
    for name, t in shapes.TRAINING.items():
        flops = shapes.training_flops(shapes.model_config(t.shape), t)
        assert flops / rate == pytest.approx(WORKLOADS_MD[name], rel=0.01), name
    for name, r in shapes.GRPO.items():
        cfg = shapes.model_config(r.shape)
        seconds = shapes.decode_floor_seconds(cfg, r.generation, bandwidth) + shapes.training_flops(cfg, r.training) / rate
        assert seconds == pytest.approx(WORKLOADS_MD[name], rel=0.02), name
    key, moved = shapes.workload(shapes.GRPO, "R3", "qwen3-4b")
    assert key == "R3-qwen3-4b" and moved.shape == "qwen3-4b" and moved.offload == 0.1


def test_a_run_that_does_not_fit_is_recorded(bench_modules, tmp_path):
    import common

    class OutOfMemoryError(RuntimeError):  # torch's and CuPy's are named so
        pass
    oom = common.write_failure(str(tmp_path), "trl-vllm", "R3", "TRL", "colocate", {}, OutOfMemoryError("CUDA out of "
                               "memory. Tried to allocate 2.32 GiB"), True, {"peak_gib": 131.2})
    kv = common.write_failure(None, "vllm", "G3", "vLLM", "defaults", {}, ValueError("No available memory for the "
                              "cache blocks"), False, {})
    other = common.write_failure(None, "trl", "L1", "TRL", "generate", {}, RuntimeError("NCCL error"), False, {})
    assert [r["metrics"]["status"] for r in (oom, kv, other)] == ["did not fit", "did not fit", "could not start"]
    assert json.loads((tmp_path / "R3-trl-vllm.json").read_text())["metrics"]["error"].startswith("OutOfMemoryError")


def test_generate_barerl(records):
    bench("generate_barerl.py", "--quick", "--workloads", "G1", "--out", str(records))
    metrics = record(records, "G1-barerl.json")["metrics"]
    assert metrics["new_tok_s"] > 0 and metrics["cold_start_first_token_s"] > 0


def test_generate_barerl_g3(records):
    bench("generate_barerl.py", "--quick", "--workload", "G3", "--timed", "1", "--out", str(records))
    assert record(records, "G3-barerl.json")["metrics"]["new_tokens"] == 64 * 8


def test_one_process_runs_one_shape():
    done = subprocess.run([sys.executable, str(BENCH / "generate_barerl.py"), "--workload", "G1", "G3"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "one process runs one model shape" in done.stderr


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


def test_train_barerl_t2_by_its_stage(records):
    """run_all.py's t2 stage: T2's loss on the last part of each sequence (--quick: 48 of 64 tokens)."""
    bench("run_all.py", "run", "t2", "--quick", "--out", str(records))
    data = record(records, "T2-barerl-keep-attention.json")
    assert data["settings"]["loss_tokens"] == 48 and data["metrics"]["planned_gib"] > 0


def test_train_barerl_on_another_shape(records):
    bench("train_barerl.py", "--quick", "--workload", "T1", "--shape", "qwen3-8b", "--keep", "attention", "--out",
          str(records))
    assert record(records, "T1-qwen3-8b-barerl-keep-attention.json")["metrics"]["step_s"] > 0


@needs("torch", "transformers")
def test_train_torch(records):
    """Selective checkpointing that keeps attention: the row with the most of torch's machinery."""
    bench("train_torch.py", "--quick", "--rows", "attention", "--out", str(records))
    assert record(records, "T1-torch-attention.json")["metrics"]["step_s"] > 0
    bench("train_torch.py", "--quick", "--workload", "T2", "--rows", "attention", "--out", str(records))
    assert record(records, "T2-torch-attention.json")["settings"]["loss_tokens"] == 48


def test_train_torch_refuses_a_bad_row():
    done = subprocess.run([sys.executable, str(BENCH / "train_torch.py"), "--rows", "sometimes"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "bad row 'sometimes'" in done.stderr


def test_grpo_barerl(records):
    bench("grpo_barerl.py", "--quick", "--steps", "2", "--out", str(records))
    metrics = record(records, "R1-barerl.json")["metrics"]
    assert len(metrics["step_s_each"]) == 2 and metrics["cold_start_first_step_end_s"] > 0
    assert metrics["mismatch_max"] < 1e-4  # fp32 on the CPU: the engine's and the trainer's log-probs agree


def test_grpo_barerl_lora(records):
    bench("grpo_barerl.py", "--quick", "--lora-r", "16", "--steps", "2", "--out", str(records))
    data = record(records, "R1-barerl-lora-r16.json")
    assert len(data["metrics"]["step_s_each"]) == 2 and data["metrics"]["mismatch_max"] < 1e-4
    assert data["settings"]["lora_r"] == 16 and "LoRA r=16" in data["label"]
    assert 0 < data["metrics"]["planned_train_gib"] < 0.01  # the tiny model's plan, LoRA's


GRPO_COMPLETIONS = {"R2": 64, "R3": 64, "L1": 16}


@pytest.mark.parametrize("name,micro_batch,offload", [("R2", 4, None), ("R3", 4, 0.1), ("L1", 1, None)])
def test_grpo_barerl_presets(records, name, micro_batch, offload):
    """The larger GRPO workloads' structure at a tiny width: micro-batches, R3's optimizer partly offloaded on an
    untied model, L1's 4 x 4 completions."""
    bench("grpo_barerl.py", "--quick", "--workload", name, "--steps", "1", "--out", str(records))
    data = record(records, f"{name}-barerl.json")
    assert data["settings"]["micro_batch"] == micro_batch and data["settings"]["offload_optimizer"] == offload
    assert data["metrics"]["completion_tokens"] <= GRPO_COMPLETIONS[name] * 16 and data["metrics"]["step_s"] > 0
    assert ("0.1 of the optimizer state offloaded" in data["label"]) == (name == "R3")



@needs("trl", "datasets")
def test_grpo_trl_without_vllm(records, tiny_model):
    bench("grpo_trl.py", "--quick", "--vllm", "off", "--steps", "1", "--model", str(tiny_model), "--out",
          str(records))
    assert record(records, "R1-trl.json")["metrics"]["step_s"] > 0


@needs("trl", "datasets", "peft")
def test_grpo_trl_lora(records, tiny_model):
    """The LoRA peer: peft adapters of grpo_barerl.py's `--lora-r`, named so in its record."""
    bench("grpo_trl.py", "--quick", "--vllm", "off", "--steps", "1", "--lora-r", "16", "--model", str(tiny_model),
          "--out", str(records))
    data = record(records, "R1-trl-lora-r16.json")
    assert data["settings"]["lora_r"] == 16 and "peft LoRA r=16" in data["label"] and data["metrics"]["step_s"] > 0
    done = subprocess.run([sys.executable, str(BENCH / "grpo_trl.py"), "--quick", "--lora-r", "-2", "--model",
                           str(tiny_model)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "--lora-r must be 0" in done.stderr


@needs("trl", "datasets")
def test_grpo_trl_r3_on_its_shape(records, tmp_path):
    """R3 on TRL at a tiny width of Qwen3-8B's shape (an untied head); a folder of another shape is refused."""
    folder = tmp_path / "tiny-8b"
    bench("make_model.py", str(folder), "--shape", "qwen3-8b", "--quick")
    bench("grpo_trl.py", "--quick", "--workload", "R3", "--vllm", "off", "--steps", "1", "--model", str(folder),
          "--out", str(records))
    assert record(records, "R3-trl.json")["settings"]["micro_batch"] == 4
    done = subprocess.run([sys.executable, str(BENCH / "grpo_trl.py"), "--quick", "--workload", "R1", "--model",
                           str(folder)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "is not the workload's model shape: tie_word_embeddings False (the workload's: True)" in done.stderr


def failing(script: str, patch: str, *args: str) -> dict:
    """`script`'s record when `patch` (Python, run first) makes it fail where a GPU run that does not fit would:
    the script must record the failure and exit with status 1, not crash without a record."""
    code = (f"import runpy, sys\n{patch}\nsys.argv = {[script, *args]!r}\n"
            f"runpy.run_path({str(BENCH / script)!r}, run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{BENCH}", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 1, f"{script}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return json.loads(next(line[7:] for line in done.stdout.splitlines() if line.startswith("RECORD ")))


def test_grpo_barerl_records_a_refused_plan():
    data = failing("grpo_barerl.py", "import barerl.train.grpo, barerl.train.memory_check as m\n"
                   "def refuse(*a, **k): raise m.MemoryPlanError('the generate phase needs 156.1 GiB')\n"
                   "barerl.train.grpo.train_grpo = refuse", "--quick", "--workload", "R3", "--offload-optimizer",
                   "1")
    assert data["name"] == "barerl-offload-1" and data["metrics"]["status"] == "did not fit"


@needs("trl", "datasets")
def test_grpo_trl_records_what_did_not_fit(tiny_model):
    data = failing("grpo_trl.py", "import torch, trl\n"
                   "def train(*a, **k): raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 9.27 GiB')\n"
                   "trl.GRPOTrainer.train = train", "--quick", "--vllm", "off", "--workload", "L1", "--steps", "1",
                   "--model", str(tiny_model))
    assert data["workload"] == "L1" and data["metrics"]["status"] == "did not fit"
    assert data["metrics"]["error"].startswith("OutOfMemoryError: CUDA out of memory")


def test_reward_parity(tmp_path, tiny_model):
    bench("reward_parity.py", "run", "--system", "barerl", "--task", "demo", "--model", str(tiny_model), "--steps",
          "1", "--batch", "16", "--device", "cpu", "--out", str(tmp_path))
    bench("reward_parity.py", "plot", "--out", str(tmp_path))
    assert (tmp_path / "reward_parity.png").exists()


def test_profile_train_step():
    assert "micro-batch" in bench("profile_train_step.py", "--quick").stdout


def test_profile_host():
    assert "us of host time per decode step" in bench("profile_host.py", "--cases", "4x32", "--profile").stdout


@pytest.mark.parametrize("script", OP_PROBES)
def test_op_probe_command_line(script):
    assert "usage" in bench(script, "--help").stdout


def test_record_and_report(records, tmp_path, bench_modules):
    """Runs after the scripts above (file order): their records filed as runs, with a peer that did not fit, then
    the table and chart."""
    if not list(records.glob("*.json")):
        pytest.skip("no records written")
    import common

    common.write_failure(str(records), "trl-vllm", "R3", "TRL", "vLLM colocate", {}, MemoryError("CUDA out of memory"),
                         True, {})
    results = tmp_path / "results"
    bench("run_all.py", "record", str(records), "--commit", "abc1234", "--results", str(results))
    table = bench("run_all.py", "report", "--results", str(results)).stdout
    rows = {line.split(" | ")[0].lstrip("| ") for line in table.splitlines() if line.startswith("| ")}
    assert {"G1", "G3", "T1", "T2", "R1", "R2", "R3", "L1", "T1-qwen3-8b"} <= rows and (results / "summary.png").exists()
    assert any(line.startswith("| R3 |") and "did not fit" in line for line in table.splitlines())
    history = (results / "R1" / "history.csv").read_text().splitlines()
    assert history[0].startswith("date,commit,run") and len(history) == 2


def test_gpu_run_usage():
    done = subprocess.run(["bash", str(BENCH / "gpu_run.sh")], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "--to DIR" in done.stdout
