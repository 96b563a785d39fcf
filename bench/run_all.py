"""The head-to-head suite (issue 6) in one command: every workload for barerl and its peers on this GPU, then a
table, a CSV and a chart.

    PYTHONPATH=src python bench/run_all.py run [--out bench_out] [--workloads G1 G2 T1 R1]
    PYTHONPATH=src python bench/run_all.py report --out DIR      # table, CSV, PNG from results already there

`run` calls the workload scripts, each in its own process (so every system's peak memory and warm-up are its
own): bench_generate.py (G1/G2, barerl and transformers' generate), bench_train_step.py (T1, barerl and
torch + transformers), bench_grpo_step.py and bench_grpo_trl.py (R1, barerl and TRL's GRPOTrainer; TRL needs
trl and datasets installed). `report` reads what they wrote (generate.csv, t1.json, r1.json, r1_trl.json;
a workload whose files are missing is left out), so results of several device calls can be merged.
vLLM is not among the peers: it cannot be installed on the measuring machine (see README, Benchmarks).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {  # workload: commands, each writing its results under the output folder
    "G1": [["bench_generate.py", "--workloads", "G1", "--csv", "{out}/generate_G1.csv"]],
    "G2": [["bench_generate.py", "--workloads", "G2", "--csv", "{out}/generate_G2.csv"]],
    "T1": [["bench_train_step.py", "--json", "{out}/t1.json"]],
    # R1 in the setting below TRL's memory (README, Benchmarks): batch_invariant off, 16 decode steps per launch,
    # 55% of the optimizer state in host memory
    "R1": [["bench_grpo_step.py", "--batch-invariant", "off", "--num-scheduler-steps", "16", "--offload-optimizer",
            "0.55", "--json", "{out}/r1.json"], ["bench_grpo_trl.py", "--json", "{out}/r1_trl.json"]],
}
FIELDS = ["workload", "metric", "barerl", "peer", "peer_value", "ratio", "barerl_peak_gib", "peer_peak_gib", "notes"]


def run(out: Path, workloads: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in workloads:
        for command in SCRIPTS[name]:
            args = [a.format(out=out) for a in command]
            print(f"=== {name}: {' '.join(args)}", flush=True)
            done = subprocess.run([sys.executable, str(HERE / args[0]), *args[1:]], cwd=HERE, check=False)
            if done.returncode:
                print(f"{name}: {args[0]} failed (exit {done.returncode}); its row is left out", flush=True)


def generation_rows(out: Path) -> list[dict]:
    rows = []
    for path in sorted(out.glob("generate*.csv")):
        with open(path) as f:
            by_key = {(r["workload"], r["system"]): r for r in csv.DictReader(f)}
        for (workload, system), r in by_key.items():
            if system != "barerl":
                continue
            peer = by_key.get((workload, "transformers"))
            rows.append(row(workload, "new tokens/s (higher is better)", float(r["new_tok_s"]), "transformers generate",
                            _number(peer, "new_tok_s"), higher_is_better=True, barerl_peak=_number(r, "peak_gib"),
                            peer_peak=_number(peer, "peak_gib"),
                            notes=f"{100 * float(r['of_hbm_bound']):.0f}% of the HBM bound"))
    return rows


def _number(record: dict | None, key: str) -> float | None:
    """A CSV field as a float; None when the record or the value is missing (a peer that did not run)."""
    return float(record[key]) if record and record.get(key) else None


def training_rows(out: Path) -> list[dict]:
    """T1's fastest barerl row (bench_train_step.py writes one per --keep set) against torch + transformers."""
    path = out / "t1.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text())["rows"]
    ours = min((r for r in rows if r["system"].startswith("barerl")), key=lambda r: r["step_s"])
    peer = next((r for r in rows if r["system"] == "torch+transformers"), None)
    setting = ours["system"].removeprefix("barerl").strip(", ")
    return [row("T1", "s/step (lower is better)", ours["step_s"], "torch + transformers",
                peer["step_s"] if peer else None, higher_is_better=False, barerl_peak=ours["peak_gib"],
                peer_peak=peer["peak_gib"] if peer else None,
                notes=f"MFU {100 * ours['mfu']:.1f}%" + (f", {setting}" if setting else ""))]


def grpo_rows(out: Path) -> list[dict]:
    if not (out / "r1.json").exists():
        return []
    ours = json.loads((out / "r1.json").read_text())
    peer = json.loads((out / "r1_trl.json").read_text()) if (out / "r1_trl.json").exists() else None

    def phases(r):
        return "/".join(f"{r[f'time/{k}']:.2f}" for k in ("generate", "score", "train"))

    notes = f"{ours['system']}; generate/score/train s: barerl {phases(ours)}" + (f", TRL {phases(peer)}" if peer else "")
    return [row("R1", "s/step (lower is better)", ours["step_s"], peer["system"] if peer else "TRL",
                peer["step_s"] if peer else None, higher_is_better=False, barerl_peak=ours.get("peak_gib"),
                peer_peak=peer.get("peak_gib") if peer else None, notes=notes)]


def row(workload, metric, ours, peer, peer_value, higher_is_better, barerl_peak, peer_peak, notes) -> dict:
    ratio = None
    if peer_value:
        ratio = ours / peer_value if higher_is_better else peer_value / ours
    return {"workload": workload, "metric": metric, "barerl": ours, "peer": peer, "peer_value": peer_value,
            "ratio": ratio, "barerl_peak_gib": barerl_peak, "peer_peak_gib": peer_peak, "notes": notes}


def fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def report(out: Path) -> list[dict]:
    rows = generation_rows(out) + training_rows(out) + grpo_rows(out)
    if not rows:
        raise SystemExit(f"{out}: no results (generate*.csv, t1.json, r1.json) to report")
    header = ["workload", "metric", "barerl", "peer", "peer", "barerl speed-up", "peak GiB barerl / peer", "notes"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        speedup = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        print(f"| {r['workload']} | {r['metric']} | {fmt(r['barerl'])} | {r['peer']} | {fmt(r['peer_value'])} | "
              f"{speedup} | {fmt(r['barerl_peak_gib'])} / {fmt(r['peer_peak_gib'])} | {r['notes']} |")
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    chart(rows, out / "summary.png")
    print(f"\nwrote {out / 'summary.csv'} and {out / 'summary.png'}")
    return rows


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["ratio"]]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    bars = ax.bar([f"{r['workload']}\nvs {r['peer']}" for r in shown], [r["ratio"] for r in shown], color="#3b75af")
    ax.bar_label(bars, labels=[f"{r['ratio']:.1f}x" for r in shown])
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_ylabel("barerl speed-up (same GPU)")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the workloads, then report")
    p.add_argument("--out", default="bench_out")
    p.add_argument("--workloads", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    p = sub.add_parser("report", help="table, CSV and chart from results already written")
    p.add_argument("--out", default="bench_out")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    if args.command == "run":
        run(out, args.workloads)
    report(out)


if __name__ == "__main__":
    main()
