"""bench/bench_multi_turn.py (workload M1) runs: its --quick form on the CPU plays every episode to its end
and reports the rates, the ratio, the idle share and where the time went, and its profile."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_quick_m1_runs_on_the_cpu(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    profile = tmp_path / "m1_profile.txt"
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_multi_turn.py"), "--quick", "--trace",
                             "--boundaries", "--profile", str(profile)],
                            env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "episodes/s" in result.stdout and "of single-turn tok/s" in result.stdout
    assert "prefix-cache hit rate 100.0%" in result.stdout  # every continued turn found its earlier blocks
    assert "trace      : admit" in result.stdout and "between steps" in result.stdout
    assert "admission steps (requests admitted:host time) " in result.stdout
    lines = [line for line in result.stdout.splitlines() if line.strip().startswith("boundary ")]
    assert len(lines) == 3, result.stdout  # 4 turns: 3 boundaries, each timed phase by phase
    assert all("environment" in line and "admission" in line and "forward" in line for line in lines)
    assert "function calls" in profile.read_text() and "episode_loop.py" in profile.read_text()
