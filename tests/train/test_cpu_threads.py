"""The host BLAS's threads: set and given back; a core left for Python while the engine and the training
loops run on the CPU; the user's own count (OPENBLAS_NUM_THREADS) kept."""

import os

import pytest
from train_helpers import grpo_config, run_grpo

from barerl.cpu_threads import blas_num_threads, blas_threads, cpu_blas_threads

pytestmark = pytest.mark.skipif(blas_num_threads() is None, reason="NumPy's BLAS is not an OpenBLAS found here")


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_blas_threads_sets_the_count_and_gives_it_back():
    before = blas_num_threads()
    with blas_threads(1):
        assert blas_num_threads() == 1
    assert blas_num_threads() == before


def test_barerl_leaves_a_core_for_python_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = blas_num_threads()
    with cpu_blas_threads():
        assert blas_num_threads() == max(1, cores() - 1)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    with cpu_blas_threads():
        assert blas_num_threads() == before


def test_the_engine_and_the_training_loop_run_on_that_count(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []

    def starts_with_seven(prompts, completions, **_):  # runs while the loop (and the engine) hold the count
        seen.append(blas_num_threads())
        return [float(c.startswith("7")) for c in completions]

    before = blas_num_threads()
    run_grpo(grpo_config(tmp_path, max_steps=1), reward_funcs=[starts_with_seven])
    assert set(seen) == {max(1, cores() - 1)}
    assert blas_num_threads() == before
