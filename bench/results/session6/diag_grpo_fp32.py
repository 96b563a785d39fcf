"""Temporary diagnostic: GRPO fp32 on CPU vs CUDA, per-step metrics side by side."""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, "tests/train")
sys.path.insert(0, "tests")
import test_loops as T

tmp = Path(tempfile.mkdtemp())
runs = {}
for device in ("cpu", "cuda"):
    cfg = T.grpo_config(tmp / device, max_steps=3, device=device, dtype="float32", log_completions_steps=1)
    T.run_grpo(cfg, T.smollm2_like_model(device, "float32"))
    runs[device] = T.metrics(tmp / device)
for step, (a, b) in enumerate(zip(runs["cpu"], runs["cuda"])):
    for key in sorted(a):
        if isinstance(a[key], float) and a[key] != b.get(key):
            rel = abs(a[key] - b[key]) / max(abs(a[key]), 1e-12)
            if rel > 1e-6:
                print(f"step {step} {key}: cpu {a[key]:.9g} cuda {b[key]:.9g} rel {rel:.2e}")
import json

lines = {d: [json.loads(x) for x in (tmp / d / "samples.jsonl").read_text().splitlines()] for d in runs}
diff = [(a["step"], a["completion"], b["completion"]) for a, b in zip(lines["cpu"], lines["cuda"])
        if a["completion"] != b["completion"]]
print(f"{len(lines['cpu'])} completions, {len(diff)} differ:", diff[:5])
