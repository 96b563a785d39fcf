"""The head-to-head suite: run the workload scripts by stage, file what they wrote as recorded runs, and build
the README's table and chart from the latest recorded runs.

    python bench/run_all.py run STAGE... --out DIR [--quick]     # each script in its own process, logs in DIR
    python bench/run_all.py record DIR --commit SHA [--date D]   # DIR's records -> bench/results/<workload>/
    python bench/run_all.py report                               # table + chart from the latest runs

Stages (STAGES below) group the scripts that fit one timed step each; `bench/gpu_run.sh` runs them on the GPU
machine with the packages each needs. A stage's model folder is MODEL for Qwen3-0.6B and MODEL-<shape> for the
others (`{model}-qwen3-4b`), each written once by make_model.py. A recorded run is
`bench/results/<workload>/<date>-<commit>/`: the JSON records of every system in it (common.write_record), the
logs of the scripts that wrote them and `commands.txt`; `history.csv` beside the runs has one line per run
(barerl against the workload's principal peer). The report pairs barerl with each peer as PAIRS says: settings
of equal work side by side; a peer that did not fit or could not start (common.write_failure) is shown so, with
no ratio. A workload run on another shape (`G1-qwen3-4b`) is reported by its workload's metric and pairs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MODEL = "/tmp/bench-model"  # the peers' model folder (make_model.py); --quick makes a tiny one beside it
MAKE_4B, MAKE_8B, MAKE_17B = (("make_model", ["make_model.py", f"{{model}}-{shape}", "--shape", shape], 240, None)
                              for shape in ("qwen3-4b", "qwen3-8b", "qwen3-1.7b"))
# stage: steps of (name, script and arguments, timeout in seconds, arguments to retry with if it fails)
STAGES = {
    "gen_barerl": [("make_model", ["make_model.py", "{model}"], 120, None),
                   ("generate_barerl", ["generate_barerl.py", "--model", "{model}"], 300, None)],
    "gen_vllm": [("make_model", ["make_model.py", "{model}"], 120, None),
                 ("generate_vllm", ["generate_vllm.py", "--model", "{model}"], 400, None)],
    "gen_hf": [("generate_transformers_compiled", ["generate_transformers.py", "--setting", "compiled"], 420, None)],
    "gen_hf_default": [("generate_transformers_default", ["generate_transformers.py", "--setting", "default"], 300,
                        None)],
    "t1": [("train_barerl", ["train_barerl.py"], 200, None),
           ("train_torch", ["train_torch.py", "--rows", "full", "attention", "full:bf16"], 300, None)],
    "t1_tuned": [("train_torch_tuned", ["train_torch.py", "--rows", "full+liger+compile"], 420,
                  ["--rows", "full+liger+compile:bf16"])],  # bf16 weights if Liger refuses autocast's mix
    "r1": [("make_model", ["make_model.py", "{model}"], 120, None),
           ("grpo_barerl", ["grpo_barerl.py", "--model", "{model}"], 180, None),
           ("grpo_barerl_invariant_off", ["grpo_barerl.py", "--model", "{model}", "--batch-invariant", "off"], 180,
            None)],
    "r1_trl_vllm": [("make_model", ["make_model.py", "{model}"], 120, None),
                    ("grpo_trl_vllm", ["grpo_trl.py", "--model", "{model}"], 420,
                     ["--vllm-gpu-memory-utilization", "0.3"])],  # TRL's default if the smallest fit fails
    "r1_trl": [("make_model", ["make_model.py", "{model}"], 120, None),
               ("grpo_trl", ["grpo_trl.py", "--model", "{model}", "--vllm", "off"], 480, None)],
    "lora": [("make_model", ["make_model.py", "{model}"], 120, None),  # R1: full parameters, then LoRA r=16
             ("grpo_barerl", ["grpo_barerl.py", "--model", "{model}"], 180, None),
             ("grpo_barerl_lora", ["grpo_barerl.py", "--model", "{model}", "--lora-r", "16"], 180, None)],
    # LoRA GRPO on the Qwen3-8B shape with R2's sizes: 8 x 8 completions of 4,096 tokens, micro-batches of 4
    "lora_8b": [("grpo_barerl_lora_8b", ["grpo_barerl.py", "--workload", "R2", "--shape", "qwen3-8b", "--lora-r",
                                        "16", "--steps", "2"], 480, None)],
    "lora_8b_trl_vllm": [MAKE_8B, ("grpo_trl_vllm_lora_8b", ["grpo_trl.py", "--workload", "R2", "--shape", "qwen3-8b",
                                                            "--model", "{model}-qwen3-8b", "--lora-r", "16",
                                                            "--steps", "2"], 540, None)],
    # the larger workloads: one timed run each (G3 --timed 1, T2 --repeats 2, a GRPO step measured after one
    # warm-up step), so that a stage fits one 10-minute command with the folder's making
    "g3": [MAKE_4B, ("generate_barerl_g3", ["generate_barerl.py", "--workload", "G3", "--model", "{model}-qwen3-4b",
                                           "--timed", "1"], 300, None)],
    "g3_vllm": [MAKE_4B, ("generate_vllm_g3", ["generate_vllm.py", "--workload", "G3", "--model", "{model}-qwen3-4b",
                                              "--timed", "1"], 420, None)],
    "t2": [("train_barerl_t2", ["train_barerl.py", "--workload", "T2", "--keep", "attention", "--repeats", "2"], 300,
            None)],
    "t2_torch": [("train_torch_t2", ["train_torch.py", "--workload", "T2", "--rows", "full+liger", "--repeats", "2"],
                  420, ["--rows", "full+liger:bf16"])],  # bf16 weights if Liger refuses autocast's mix
    "r2": [MAKE_4B, ("grpo_barerl_r2", ["grpo_barerl.py", "--workload", "R2", "--model", "{model}-qwen3-4b",
                                       "--steps", "2"], 360, None)],
    "r2_trl_vllm": [MAKE_4B, ("grpo_trl_vllm_r2", ["grpo_trl.py", "--workload", "R2", "--model", "{model}-qwen3-4b",
                                                  "--steps", "2"], 480, None)],
    "r3": [MAKE_8B, ("grpo_barerl_r3", ["grpo_barerl.py", "--workload", "R3", "--model", "{model}-qwen3-8b",
                                       "--steps", "2"], 360, None)],
    # R3 with the whole optimizer state in host memory: 55 GiB at its peak, for a card of 80 GB (the preset's 10%
    # needs an H200's 141)
    "r3_offload": [MAKE_8B, ("grpo_barerl_r3_offload", ["grpo_barerl.py", "--workload", "R3", "--model",
                                                       "{model}-qwen3-8b", "--steps", "2", "--offload-optimizer"],
                             360, None)],
    "r3_trl_vllm": [MAKE_8B, ("grpo_trl_vllm_r3", ["grpo_trl.py", "--workload", "R3", "--model", "{model}-qwen3-8b",
                                                  "--steps", "2"], 420, None)],
    "l1": [MAKE_17B, ("grpo_barerl_l1", ["grpo_barerl.py", "--workload", "L1", "--model", "{model}-qwen3-1.7b",
                                        "--steps", "2"], 480, None)],
    # L1 with batch_invariant off: decode attention splits the keys of its 16 long sequences (on, 16 x 8 kv heads
    # fill 128 CTAs that each read a whole 16K context: two steps did not end within 480 s on an H100)
    "l1_off": [MAKE_17B, ("grpo_barerl_l1_off", ["grpo_barerl.py", "--workload", "L1", "--model",
                                                "{model}-qwen3-1.7b", "--steps", "2", "--batch-invariant", "off"],
                          480, None)],
    "l1_trl_vllm": [MAKE_17B, ("grpo_trl_vllm_l1", ["grpo_trl.py", "--workload", "L1", "--model",
                                                   "{model}-qwen3-1.7b", "--steps", "1"], 480, None)],
}
METRIC = {"G1": ("new_tok_s", True), "G2": ("new_tok_s", True), "G3": ("new_tok_s", True),
          **{name: ("step_s", False) for name in ("T1", "T2", "R1", "R2", "R3", "L1")}}
GENERATION_PAIRS = [("barerl", "vllm"), ("barerl", "transformers-compiled"), ("barerl", "transformers-default")]
GRPO_PAIRS = [("barerl", "trl-vllm"), ("barerl-batch-invariant-off", "trl-vllm"), ("barerl", "trl"),
              ("barerl-lora-r16", "trl-vllm-lora-r16")]
PAIRS = {  # (barerl record, peer record): settings of the same work; the first present is the principal one
    "G1": GENERATION_PAIRS, "G2": GENERATION_PAIRS, "G3": GENERATION_PAIRS,
    "T1": [("barerl-keep-none", "torch-full"), ("barerl-keep-attention", "torch-attention"),
           ("barerl-keep-attention", "torch-full-liger-compile"), ("barerl-keep-attention", "torch-full-liger-compile-bf16"),
           ("barerl-keep-attention", "torch-full-bf16")],
    "T2": [("barerl-keep-attention", "torch-full-liger"), ("barerl-keep-attention", "torch-full-liger-bf16"),
           ("barerl-keep-none", "torch-full"), ("barerl-keep-attention", "torch-attention")],
    "R1": GRPO_PAIRS, "R2": GRPO_PAIRS, "R3": GRPO_PAIRS, "L1": GRPO_PAIRS,
}
WORKLOAD_LINE = re.compile(r"([GTRL]\d(-\S+)? |vLLM )")  # the scripts' figures in a log
HISTORY_FIELDS = ["date", "commit", "run", "metric", "barerl", "barerl_setting", "peer", "peer_value", "ratio"]


def run(stages: list[str], out: Path, quick: bool, deadline: float | None) -> None:
    """Each step of each stage in its own process, within its timeout and the deadline; a failure is logged
    and the next step runs."""
    out.mkdir(parents=True, exist_ok=True)
    model = MODEL + ("-quick" if quick else "")
    for stage in stages:
        for name, argv, timeout, retry in STAGES[stage]:
            args = [a.format(model=model) for a in argv] + (["--quick"] if quick else [])
            args += [] if name == "make_model" else ["--out", str(out)]
            rc = run_step(name, args, timeout, out, deadline)
            if rc and retry:
                run_step(f"{name}_retry", args + retry, timeout, out, deadline)


def run_step(name: str, args: list[str], timeout: float, out: Path, deadline: float | None) -> int:
    left = timeout if deadline is None else min(timeout, deadline - time.time())
    command = " ".join(["python", f"bench/{args[0]}", *args[1:]])
    if left < 10:
        print(f"=== {name}: skipped, {left:.0f} s left before the deadline", flush=True)
        return 1
    print(f"=== {name} ({time.strftime('%H:%M:%S')}, at most {left:.0f} s): {command}", flush=True)
    start = time.time()
    with open(out / f"{name}.log", "w") as log:
        # a process group of its own: a timeout ends the script's workers too (vLLM's engine core), so they
        # hold no GPU memory into the next step
        child = subprocess.Popen([sys.executable, str(HERE / args[0]), *args[1:]], cwd=HERE.parent, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = child.wait(timeout=left)
        except subprocess.TimeoutExpired:
            rc = 124
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:  # no process of the group is left
                pass
            child.wait()
    seconds = time.time() - start
    with open(out / "commands.txt", "a") as f:
        f.write(f"{command}\t# rc={rc} {seconds:.0f} s\n")
    lines = (out / f"{name}.log").read_text(errors="replace").splitlines()
    shown = [line for line in lines if WORKLOAD_LINE.match(line)] or lines[-8:]
    print("\n".join(line[:300] for line in shown[-12:]), flush=True)
    print(f"--- {name}: rc={rc}, {seconds:.0f} s", flush=True)
    return rc


def load_records(folder: Path) -> list[dict]:
    """The records of one run (files of another form, kept from older runs, are left out)."""
    found = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return [r for r in found if isinstance(r, dict) and {"workload", "name", "metrics"} <= r.keys()]


def record(source: Path, commit: str, day: str | None, results: Path) -> None:
    """File `source`'s records (and the logs and commands that made them) under results/<workload>/."""
    by_workload: dict[str, list[Path]] = {}
    for path in sorted(source.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "workload" in data:  # a record (common.write_record), not another file
            by_workload.setdefault(data["workload"], []).append(path)
    if not by_workload:
        raise SystemExit(f"record: no JSON records in {source}")
    for workload, paths in by_workload.items():
        day_of_run = day or json.loads(paths[0].read_text())["date"]
        folder = results / workload / f"{day_of_run}-{commit}"
        folder.mkdir(parents=True, exist_ok=True)
        logs = [p for p in source.glob("*.log") if f'"workload": "{workload}"' in p.read_text(errors="replace")]
        for path in [*paths, *logs]:  # the records and the logs of the scripts that wrote them
            shutil.copy2(path, folder / path.name)
        for path in source.glob("*.txt"):  # commands, GPU: appended, so that a run filed in parts keeps all
            with open(folder / path.name, "a") as f:
                f.write(path.read_text())
        append_history(workload, folder)
        print(f"recorded {workload}: {folder}")


def base(workload: str) -> str:
    """The workload whose metric and pairs a record's workload takes (G1 for G1-qwen3-4b: G1's sizes on 4B)."""
    return workload.split("-", 1)[0]


def figure(record: dict | None, key: str):
    """A record's figure, or its status where the run did not fit or start (None without a record)."""
    if record is None:
        return None
    return record["metrics"].get(key, record["metrics"].get("status"))


def pairs_of(workload: str, records: list[dict]) -> list[tuple[dict, dict | None]]:
    """(barerl, peer) record pairs present in one run, in PAIRS' order; barerl alone if no peer ran."""
    by_name = {r["name"]: r for r in records}
    found = [(by_name[a], by_name[b]) for a, b in PAIRS.get(base(workload), []) if a in by_name and b in by_name]
    return found or [(r, None) for r in records if r["name"].startswith("barerl")][:1]


def ratio(workload: str, ours, peer) -> float | None:
    """barerl's speed-up over the peer (None where either has no figure)."""
    if not all(isinstance(v, (int, float)) and v for v in (ours, peer)):
        return None
    return ours / peer if METRIC[base(workload)][1] else peer / ours


def append_history(workload: str, folder: Path) -> None:
    pairs = pairs_of(workload, load_records(folder))
    if not pairs:
        return
    ours, peer = pairs[0]
    key = METRIC[base(workload)][0]
    path = folder.parent / "history.csv"
    rows = [r for r in read_history(path) if r["run"] != folder.name]  # a run filed again moves to the end
    commit = folder.name.split("-", 3)[-1]
    rows.append({"date": ours["date"], "commit": commit, "run": folder.name, "metric": key,
                 "barerl": figure(ours, key), "barerl_setting": ours.get("label", ours["name"]),
                 "peer": peer and peer["system"], "peer_value": figure(peer, key),
                 "ratio": ratio(workload, figure(ours, key), figure(peer, key))})
    with open(path, "w", newline="") as f:  # in the order the runs were filed: the last is the latest
        writer = csv.DictWriter(f, fieldnames=HISTORY_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def runs_newest_first(results: Path, workload: str) -> list[Path]:
    """The runs in the order they were filed, newest first (history.csv; commits do not sort by time)."""
    return [results / workload / r["run"] for r in reversed(read_history(results / workload / "history.csv"))]


def recorded_workloads(results: Path) -> list[str]:
    """Workloads with recorded runs: PAIRS' order, then those run on other shapes."""
    found = {p.parent.name for p in results.glob("*/history.csv") if base(p.parent.name) in PAIRS}
    return [w for w in PAIRS if w in found] + sorted(found - set(PAIRS))


def table_rows(results: Path) -> list[dict]:
    """Per workload and pair of PAIRS: the newest run that holds both records (barerl and that peer); a workload
    with no such pair: its newest barerl record alone."""
    rows = []
    for workload in recorded_workloads(results):
        runs = [(f, load_records(f)) for f in runs_newest_first(results, workload)]
        found = []
        for pair in PAIRS[base(workload)]:
            run = next(((f, rs) for f, rs in runs if pair in [(a["name"], b["name"]) for a, b in pairs_of(workload, rs)
                                                              if b]), None)
            if run is not None:
                found.append((run[0], *(next(r for r in run[1] if r["name"] == name) for name in pair)))
        alone = next(((f, *pairs_of(workload, rs)[0]) for f, rs in runs if pairs_of(workload, rs)), None)
        rows += [table_row(workload, *row) for row in found or ([alone] if alone else [])]
    return rows


def table_row(workload: str, folder: Path, ours: dict, peer: dict | None) -> dict:
    key = METRIC[base(workload)][0]
    return {"workload": workload, "run": folder.name, "barerl": figure(ours, key),
            "barerl_setting": ours.get("label", ours["name"]), "of_floor": of_floor(ours),
            "peer": peer and peer["system"], "peer_setting": peer and peer.get("label", peer["name"]),
            "peer_value": figure(peer, key), "peer_name": peer and peer["name"],
            "ratio": ratio(workload, figure(ours, key), figure(peer, key)), "barerl_gib": peak(ours),
            "peer_gib": peer and peak(peer)}


def of_floor(record: dict) -> float | None:
    """The fraction of its floor a run reached: generation's HBM floor, training's MFU, a GRPO step's floor."""
    m = record["metrics"]
    return next((m[k] for k in ("of_hbm_bound", "mfu_measured", "of_floor") if m.get(k)), None)


def peak(record: dict) -> float | None:
    m = record["metrics"]
    keys = ("peak_gib", "trainer_peak_gib", "torch_max_reserved_gib", "engine_peak_gib", "pool_gib", "torch_max_allocated_gib")
    return next((m[k] for k in keys if m.get(k)), None)


def fmt(value, digits: int = 2, unit: str = "") -> str:
    """A figure in the table; a status (a run that did not fit) as it is; "-" for none."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return (f"{value:,.0f}" if abs(value) >= 100 else f"{value:.{digits}f}") + (f" {unit}" if unit else "")


def report(results: Path) -> None:
    rows = table_rows(results)
    if not rows:
        raise SystemExit(f"report: no recorded runs under {results}")
    units = {"new_tok_s": "new tok/s", "step_s": "s"}
    header = ["workload", "barerl (setting)", "peer (setting)", "barerl", "of its floor", "peer", "barerl speed-up",
              "peak GiB barerl / peer", "run"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        unit = units[METRIC[base(r["workload"])][0]]
        speedup = f"**{r['ratio']:.2f}x**" if r["ratio"] else "-"
        peer = f"{r['peer']}, {r['peer_setting']}" if r["peer"] else "-"
        floor = f"{r['of_floor']:.0%}" if r["of_floor"] else "-"
        lines.append(f"| {r['workload']} | {r['barerl_setting']} | {peer} | {fmt(r['barerl'], unit=unit)} | {floor} | "
                     f"{fmt(r['peer_value'], unit=unit)} | {speedup} | {fmt(r['barerl_gib'], 1)} / "
                     f"{fmt(r['peer_gib'], 1)} | {r['run']} |")
    (results / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    chart(rows, results / "summary.png")
    print(f"\nwrote {results / 'summary.md'} and {results / 'summary.png'}")


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["ratio"]]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    short = {"vllm": "vLLM", "transformers-compiled": "transformers\ncompiled", "trl-vllm": "TRL + vLLM",
             "transformers-default": "transformers\ndefault", "trl": "TRL"}
    labels = [f"{r['workload']} vs\n{short.get(r['peer_name'], r['peer_name'].split('-')[0])}" for r in shown]
    bars = ax.bar(labels, [r["ratio"] for r in shown], color="#3b75af")
    ax.bar_label(bars, labels=[f"{r['ratio']:.1f}x" for r in shown])
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_ylabel("barerl speed-up (same GPU, same run)")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run stages of workload scripts")
    p.add_argument("stages", nargs="+", choices=list(STAGES))
    p.add_argument("--out", required=True, help="folder for the records and logs")
    p.add_argument("--quick", action="store_true", help="every script's CPU smoke test")
    p.add_argument("--deadline", type=float, default=float(os.environ.get("BENCH_DEADLINE") or 0) or None,
                   help="epoch seconds by which every step has ended (default: $BENCH_DEADLINE)")
    p = sub.add_parser("record", help="file a folder of records as recorded runs")
    p.add_argument("source")
    p.add_argument("--commit", required=True, help="the commit the records were measured at")
    p.add_argument("--date", default=None, help="default: the records' own date")
    p = sub.add_parser("report", help="the README's table and chart from the latest recorded runs")
    for p in sub.choices["record"], sub.choices["report"]:
        p.add_argument("--results", default=str(RESULTS), help="the recorded runs' root (default bench/results)")
    args = parser.parse_args()
    if args.command == "run":
        run(args.stages, Path(args.out).resolve(), args.quick, args.deadline)
    elif args.command == "record":
        record(Path(args.source), args.commit, args.date, Path(args.results))
    else:
        report(Path(args.results))


if __name__ == "__main__":
    main()
