"""The memory plans of the training workloads (T1, T2, R1, R2, R3, L1 in bench/shapes.py, in the settings their
scripts run), as Markdown tables for docs/MEMORY.md: each phase's parts in GiB, predicted by
barerl.train.memory_plan, with an empty column for the figure measured on the GPU.

    PYTHONPATH=src python bench/memory_plans.py [--workloads R3 L1]
"""

from __future__ import annotations

import argparse
import dataclasses

from grpo_barerl import grpo_config
from shapes import GRPO, TRAINING, model_config
from train_barerl import training_config

from barerl.train.memory_plan import GIB, MemoryPlan, plan_training

# (workload, variant, changes: "offload" of the workload's sizes, "keep" of the recomputation)
VARIANTS = {
    "T1": [("keep attention", {}), ("keep attention,linear", {"keep": ("attention", "linear")})],
    "T2": [("keep attention", {}), ("keep attention,linear", {"keep": ("attention", "linear")})],
    "R1": [("resident", {}), ("--offload-optimizer 0.55", {"offload": 0.55}), ("--offload-optimizer", {"offload": 1.0})],
    "R2": [("resident", {}), ("keep attention,linear", {"keep": ("attention", "linear")})],
    "R3": [("optimizer resident (does not fit)", {"offload": None}), ("--offload-optimizer 0.1 (the preset)", {}),
           ("--offload-optimizer 0.01 (the smallest that fits)", {"offload": 0.01}),
           ("--offload-optimizer (all of it)", {"offload": 1.0})],
    "L1": [("resident", {})],
}


def plan_of(workload: str, changes: dict) -> MemoryPlan:
    """The plan of what train_barerl.py / grpo_barerl.py run for `workload`, with `changes`."""
    keep = changes.get("keep", ("attention",))
    if workload in TRAINING:
        t = TRAINING[workload]
        return plan_training(model_config(t.shape), "bfloat16", training_config(t, keep))
    work = dataclasses.replace(GRPO[workload], offload=changes.get("offload", GRPO[workload].offload))
    return plan_training(model_config(work.shape), "bfloat16", grpo_config(work, "unused", keep=keep))


def markdown(plan: MemoryPlan) -> str:
    names = list(dict.fromkeys(p.name for phase in plan.phases for p in phase.parts))
    head = "| part | " + " | ".join(p.name for p in plan.phases) + " |"
    lines = [head, "|---" * (len(plan.phases) + 1) + "|"]
    for name in names:
        cells = [f"{phase.get(name) / GIB:.2f}" if any(p.name == name for p in phase.parts) else "-"
                 for phase in plan.phases]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| **total (planned)** | " + " | ".join(f"**{p.nbytes / GIB:.1f}**" for p in plan.phases) + " |")
    lines.append("| measured (H200) | " + " | ".join("" for _ in plan.phases) + " |")
    if plan.host:
        lines.append(f"\nHost (pinned): {sum(p.nbytes for p in plan.host) / GIB:.1f} GiB; the link carries "
                     f"{plan.link_bytes / GIB:.1f} GiB up and back per optimizer step.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    for workload in args.workloads:
        for variant, changes in VARIANTS[workload]:
            print(f"### {workload}, {variant}\n\n{markdown(plan_of(workload, changes))}\n")


if __name__ == "__main__":
    main()
