"""Workload M1: multi-turn rollouts with tools in the engine's step loop, against single-turn generation.

M1 (Qwen3-0.6B architecture, random bf16 weights, one GPU): 64 episodes (8 prompts x 8 samples, 128-token
random prompts, as G1) of 4 model turns each. Every turn samples exactly 256 tokens (temperature 1, EOS
ignored); after each of the first three, a tool that sleeps 50 ms answers with 64 tokens, appended to the
episode's sequence; the episode's next turn is a new engine request over all its ids so far, its KV found
again in the prefix cache, and while one episode waits for its tool the others decode. Reported: episodes/s,
new (sampled) tokens/s, the G1-style single-turn rate at equal sampled tokens (the same 64 sequences x
1,024 new tokens, measured in the same process on the same engine), their ratio (goal: >= 85%), the GPU
idle share (time the engine had nothing to run because every unfinished episode waited for its tool, over
the multi-turn wall time) and the prefix-cache hit rate of continued turns. Each measurement follows a
warm-up run of the same shape (kernels compiled, CUDA graphs captured, the environment pool's threads
started: one pool serves both runs, as GRPO keeps one for its whole run). The tool results are fixed ids
(no tokenizer: the weights are random), so chat-template rendering is not part of the measurement.

    PYTHONPATH=src python bench/bench_multi_turn.py [--batch-invariant on|off] [--quick | --host] [--trace]
        [--boundaries] [--profile F]

`--trace` adds where the measured multi-turn run's time went, by kind of engine step: admissions (new
turns' prefill), lookahead launches, single steps, and the time between steps (the loop's own work and the
waits for tools); each admission step's requests admitted and seconds; and the garbage collector's collections
in the run, their number and time, and those of them that fell between engine steps (in the loop's own work).
`--boundaries` adds each turn boundary of the measured run phase by phase: the ending turns' recording, the wait
for their tools, the next turns' adding, the admission step (its scheduling, its arrays, its forward's host time
and, on the GPU, the share of it spent making cuBLASLt plans for product shapes met the first time, and its device
time, and the rest: sampling, fetching, recording) and the loop's work until the next engine step; the wrappers
cost a few microseconds a call. `--profile F` writes the host's
functions in the measured multi-turn run (cProfile of the loop's thread, by own time and by time inside) to F: it slows
the host, so its run's figures are not M1's.

`--quick` runs the same code on the CPU with a tiny model (8 episodes of 4 turns x 16 tokens, 8-token tool
results, 10 ms sleeps): a check that the benchmark works, not a measurement. `--host` runs M1 itself on the
CPU with the tiny model, its KV cache large enough for every episode, so that turns end together as on the GPU:
its figures are not M1's, but the host's work at each boundary (`--boundaries`: the loop, the scheduling, the
arrays; not the forward) is, measured without a GPU (about a minute; with OMP_NUM_THREADS=1, so that NumPy's
threads do not contend with the loop's).
"""

from __future__ import annotations

import argparse
import gc
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

PROMPT_LEN = 128


@dataclass(frozen=True)
class Shape:
    num_prompts: int
    samples: int
    turns: int
    turn_tokens: int
    tool_tokens: int
    tool_seconds: float


M1 = Shape(num_prompts=8, samples=8, turns=4, turn_tokens=256, tool_tokens=64, tool_seconds=0.05)
QUICK = Shape(num_prompts=2, samples=4, turns=4, turn_tokens=16, tool_tokens=8, tool_seconds=0.01)
TINY = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "tie_word_embeddings": True, "max_position_embeddings": 2048}


def episode_tokens(shape: Shape) -> int:
    """An episode's tokens after its prompt: the sampled ones and the tool results."""
    return shape.turns * shape.turn_tokens + (shape.turns - 1) * shape.tool_tokens


class FixedTokens:
    """An episode codec without a tokenizer: no text, and every tool result is the same fixed ids."""

    def __init__(self, observation_ids: list[int]):
        self.observation_ids = observation_ids

    def text(self, ids) -> str:
        return ""

    def observation(self, history, messages, turn_ids, tools) -> list[int]:
        return list(self.observation_ids)


def sleeping_tool(shape: Shape):
    """An environment whose tool sleeps shape.tool_seconds after each turn but the last, which ends it."""
    from barerl.train.environments import Environment, Observation

    class SleepingTool(Environment):
        def __init__(self):
            self.turns = 0

        def step(self, text):
            self.turns += 1
            if self.turns == shape.turns:
                return Observation(done=True)
            time.sleep(shape.tool_seconds)
            return Observation([{"role": "tool", "content": "result"}])

    return SleepingTool


def episodes(prompts: list[list[int]], shape: Shape, codec: FixedTokens) -> list[list]:
    from barerl.train.episode import Episode

    env_class = sleeping_tool(shape)
    budget = episode_tokens(shape) + 1  # room beyond the last turn: the budget never cuts one
    return [[Episode(env_class(), codec, [], prompt, budget, shape.turns, 1000 + p, i) for i in range(shape.samples)]
            for p, prompt in enumerate(prompts)]


class StepTrace:
    """Wraps an engine's step: for each, its kind ('admit': requests were waiting, so it prefilled new turns;
    'lookahead': several tokens a sequence; 'single'), the host's start and end of it, and the requests it
    admitted. Also times the garbage collector's collections (start and end of each)."""

    def __init__(self, engine):
        self.engine, self.steps, self.collections = engine, [], []
        self._collection_start = 0.0

    def _collected(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._collection_start = time.perf_counter()
        else:
            self.collections.append((self._collection_start, time.perf_counter()))

    def __enter__(self):
        gc.callbacks.append(self._collected)
        def step(*args, **kwargs):
            scheduler = self.engine.scheduler
            waiting, running = len(scheduler.waiting), len(scheduler.running)
            start = time.perf_counter()
            sampled = original(*args, **kwargs)
            kind = "admit" if waiting else "lookahead" if len(sampled) > max(running, 1) else "single"
            self.steps.append((kind, start, time.perf_counter(), waiting - len(scheduler.waiting)))
            return sampled

        original = self.engine.step
        self.engine.step = step
        return self

    def __exit__(self, *exc) -> None:
        del self.engine.step  # the instance attribute: the class's method again
        gc.callbacks.remove(self._collected)

    def summary(self, wall_seconds: float) -> str:
        kinds = {}
        for kind, start, end, _ in self.steps:
            count, total = kinds.get(kind, (0, 0.0))
            kinds[kind] = (count + 1, total + end - start)
        in_steps = sum(end - start for _, start, end, _ in self.steps)
        parts = [f"{kind} {count} steps {total:.3f} s" for kind, (count, total) in sorted(kinds.items())]
        admissions = " ".join(f"{admitted}:{(end - start) * 1e3:.0f}ms"
                              for kind, start, end, admitted in self.steps if kind == "admit")
        between = [(a, b) for a, b in self.collections
                   if not any(start <= a and b <= end for _, start, end, _ in self.steps)]
        return (", ".join(parts) + f", between steps {wall_seconds - in_steps:.3f} s; admission steps "
                f"(requests admitted:host time) {admissions}; garbage collections {len(self.collections)} "
                f"{self._ms(self.collections)} ms, between steps {len(between)} {self._ms(between)} ms")

    @staticmethod
    def _ms(spans) -> str:
        return f"{sum(b - a for a, b in spans) * 1e3:.1f}"


class BoundaryTrace:
    """Times each turn boundary of a multi-turn run phase by phase (`--boundaries`): wraps the episode loop's
    and the engine's methods while inside, recording (name, start, end) of each call, the engine steps' taken
    from a StepTrace; on the GPU an eager forward (an admission's) also records CUDA events, read once the run
    is over."""

    def __init__(self, llm, loop, steps: StepTrace):
        from barerl.engine import model_runner

        self.events: list[tuple[str, float, float, object]] = []
        self._steps = steps
        self._targets = [(loop, "_end_turn", "ended"), (loop, "_ready_steps", "environment"),
                         (loop, "_observe", "continued"), (llm.engine.scheduler, "schedule", "schedule"),
                         (model_runner, "prepare_step", "arrays"), (llm.model, "forward_paged", "forward")]
        self._device = llm.model.device == "cuda"
        if self._device:  # cuBLASLt plans made for a product shape met for the first time (a new row count)
            from barerl.ops.cuda import cublaslt

            self._targets.append((cublaslt._Lt, "_make_plan", "plan"))
        self._saved = []

    def __enter__(self):
        for owner, name, label in self._targets:
            self._saved.append((owner, name, owner.__dict__.get(name)))
            setattr(owner, name, self._timed(getattr(owner, name), label))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, before in reversed(self._saved):
            if before is None:
                delattr(owner, name)  # the instance attribute: the class's method again
            else:
                setattr(owner, name, before)

    def _timed(self, call, label: str):
        def timed(*args, **kwargs):
            eager = label == "forward" and kwargs.get("max_position") is None  # graphs pass a bound
            marks = self._device_marks() if eager else None
            start = time.perf_counter()
            result = call(*args, **kwargs)
            end = time.perf_counter()
            if marks is not None:
                marks[1].record()
            self.events.append((label if not eager else "eager forward", start, end, marks))
            return result

        return timed

    def _device_marks(self):
        if not self._device:
            return None
        import cupy

        marks = cupy.cuda.Event(), cupy.cuda.Event()
        marks[0].record()
        return marks

    def summary(self) -> list[str]:
        """One line a boundary: from the first turn that ended to the engine step after the admission."""
        steps = [("step", start, end, None) for _, start, end, _ in self._steps.steps]
        events = sorted(self.events + steps, key=lambda e: e[1])
        lines, i = [], 0
        while i < len(events):
            if events[i][0] != "ended":
                i += 1
                continue
            phases: dict[str, list] = {}
            while i < len(events) and not (events[i][0] == "step" and "continued" in phases):
                phases.setdefault(events[i][0], []).append(events[i])
                i += 1
            if i == len(events):  # the episodes' last turns: nothing is admitted after them
                break
            admission = events[i]
            inside = [e for e in events[i + 1:] if e[1] < admission[2]]
            after = next((e for e in events[i + 1:] if e[0] == "step"), None)
            lines.append(self._line(len(lines) + 1, phases, admission, inside, after))
            i += 1 + len(inside)
        return lines

    @staticmethod
    def _ms(seconds: float) -> str:
        return f"{seconds * 1e3:.1f}"

    @staticmethod
    def _span(events) -> float:
        return (max(e[2] for e in events) - min(e[1] for e in events)) * 1e3 if events else 0.0

    def _line(self, number, phases, admission, inside, after) -> str:
        parts = {label: sum(e[2] - e[1] for e in inside if e[0] == label) for label in
                 ("schedule", "arrays", "eager forward")}
        forward = [e for e in inside if e[0] == "eager forward"]
        device = ""
        if forward and forward[0][3] is not None:
            import cupy

            forward[0][3][1].synchronize()
            plans = [e for e in inside if e[0] == "plan"]
            device = (f" (making {len(plans)} product plans: {self._ms(sum(e[2] - e[1] for e in plans))}) / "
                      f"{cupy.cuda.get_elapsed_time(*forward[0][3]):.1f} device")
        step = admission[2] - admission[1]
        rest = step - sum(parts.values())
        gap = f", then {self._ms(after[1] - admission[2])} ms to the next step" if after else ""
        ended, waited, continued = (self._span(phases.get(label, []))
                                    for label in ("ended", "environment", "continued"))
        return (f"boundary {number}: ended {ended:.1f} ms, environment {waited:.1f} ms, continued {continued:.1f} "
                f"ms, admission {self._ms(step)} ms (schedule {self._ms(parts['schedule'])}, arrays "
                f"{self._ms(parts['arrays'])}, forward {self._ms(parts['eager forward'])} host{device}, rest "
                f"{self._ms(rest)}){gap}")


def run_multi_turn(llm, steps, prompts: list[list[int]], shape: Shape, codec: FixedTokens, trace: bool = False,
                   profile: str | None = None, boundaries: bool = False) -> dict:
    """steps: the environment steps' WorkerPool, one for every run, as GRPO keeps one for its whole run."""
    from barerl.engine.sampling_params import SamplingParams
    from barerl.train.episode_loop import EpisodeLoop
    from barerl.train.episode_metrics import EpisodeStats

    groups = episodes(prompts, shape, codec)
    params = SamplingParams(temperature=1.0, max_tokens=shape.turn_tokens, ignore_eos=True)
    loop = EpisodeLoop(llm.engine, steps, params, step_timeout=60)
    with (StepTrace(llm.engine) as traced,
          BoundaryTrace(llm, loop, traced) if boundaries else nullcontext() as phases):
        stats = loop.run(groups) if profile is None else profiled(lambda: loop.run(groups), profile)
    played = [e for group in groups for e in group]
    assert all(e.end == "done" and e.num_turns == shape.turns for e in played), [e.end for e in played]
    metrics = EpisodeStats.from_episodes(played, stats).metrics()
    return {"seconds": stats.wall_seconds, "sampled": sum(e.num_sampled_tokens for e in played),
            "episodes": len(played), "idle_share": metrics["time/gpu_idle_share"],
            "cache_hit_rate": metrics["engine/prefix_cache_hit_rate"], "engine_seconds": stats.engine_seconds,
            "trace": traced.summary(stats.wall_seconds) if trace else None,
            "boundaries": phases.summary() if boundaries else None}


def profiled(call, path: str):
    """call() under cProfile; its functions by own time and by time inside them, 40 of each, written to path."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    result = profiler.runcall(call)
    text = io.StringIO()
    for order in ("tottime", "cumulative"):
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(40)
    with open(path, "w") as f:
        f.write(text.getvalue())
    return result


def run_single_turn(llm, prompts: list[list[int]], shape: Shape) -> dict:
    from barerl.engine.sampling_params import SamplingParams

    new_tokens = shape.turns * shape.turn_tokens
    params = SamplingParams(n=shape.samples, temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=0)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sampled": sum(len(o.token_ids) for r in outputs for o in r.outputs)}


def make_llm(cpu: bool, shape: Shape, batch_invariant: bool):
    from barerl.config import ModelConfig
    from barerl.engine.config import EngineConfig
    from barerl.engine.llm import LLM
    from barerl.model.model import Model

    max_model_len = PROMPT_LEN + episode_tokens(shape) + 1
    seqs = shape.num_prompts * shape.samples
    if cpu:  # room for every episode twice over: no episode waits for blocks, none's cached blocks are evicted
        blocks = max(2048, 2 * seqs * -(-max_model_len // EngineConfig.block_size))
        model = Model.random(ModelConfig.from_dict(TINY, source="tiny"), seed=0)
        return LLM(model, max_num_seqs=seqs, max_model_len=max_model_len, num_kv_blocks=blocks)
    from shapes import QWEN3_06B

    model = Model.random(ModelConfig.from_dict(QWEN3_06B, source="Qwen3-0.6B shape"), device="cuda",
                         dtype="bfloat16", seed=0)
    return LLM(model, max_num_seqs=seqs, max_model_len=max_model_len, gpu_memory_utilization=0.6,
               batch_invariant=batch_invariant)


def settle(llm) -> None:
    """Before a timed run: the device idle, and what earlier runs left collected now, so that no run pays for
    another's garbage (a full collection during one run of M1 on a 2-core CPU took 60-100 ms, in whichever run
    crossed the collector's threshold)."""
    if llm.model.device == "cuda":
        import cupy

        cupy.cuda.Device().synchronize()
    gc.collect()


def main(argv: list[str] | None = None) -> dict:
    from barerl.train.worker_pool import WorkerPool

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="a tiny model on the CPU: checks the script only")
    sizes.add_argument("--host", action="store_true", help="M1 with a tiny model on the CPU: the host's phases")
    parser.add_argument("--trace", action="store_true", help="where the multi-turn run's time went, by step kind")
    parser.add_argument("--boundaries", action="store_true", help="each turn boundary's time, phase by phase")
    parser.add_argument("--profile", metavar="FILE", help="cProfile of the measured multi-turn run, written to FILE")
    parser.add_argument("--batch-invariant", default="off", choices=["on", "off"],
                        help="the engine's batch_invariant (G1's figures are with it off)")
    args = parser.parse_args(argv)
    shape = QUICK if args.quick else M1
    llm = make_llm(args.quick or args.host, shape, args.batch_invariant == "on")
    rng = np.random.default_rng(0)
    vocab = llm.model.cfg.vocab_size
    prompts = rng.integers(0, vocab, (shape.num_prompts, PROMPT_LEN)).tolist()
    codec = FixedTokens(rng.integers(0, vocab, shape.tool_tokens).tolist())
    with WorkerPool(shape.num_prompts * shape.samples, "bench-env") as steps:
        for warm_up in (True, False):
            settle(llm)
            multi = run_multi_turn(llm, steps, prompts, shape, codec, args.trace, None if warm_up else args.profile,
                                   args.boundaries)
            settle(llm)
            single = run_single_turn(llm, prompts, shape)
    rate, single_rate = multi["sampled"] / multi["seconds"], single["sampled"] / single["seconds"]
    result = {"episodes_per_s": multi["episodes"] / multi["seconds"], "new_tok_s": rate,
              "single_turn_tok_s": single_rate, "ratio": rate / single_rate, "gpu_idle_share": multi["idle_share"],
              "prefix_cache_hit_rate": multi["cache_hit_rate"]}
    name = ("M1 (quick, CPU)" if args.quick else "M1 (tiny model, CPU: the host's phases only)" if args.host
            else f"M1 batch_invariant {args.batch_invariant}")
    print(f"{name}: {multi['episodes']} episodes x {shape.turns} turns x {shape.turn_tokens} sampled tokens, "
          f"{shape.tool_tokens}-token tool results after {shape.tool_seconds * 1e3:.0f} ms")
    print(f"  multi-turn : {multi['seconds']:.3f} s, {result['episodes_per_s']:.1f} episodes/s, {rate:.0f} new tok/s, "
          f"GPU idle share {result['gpu_idle_share']:.1%}, prefix-cache hit rate {result['prefix_cache_hit_rate']:.1%}")
    if multi["trace"]:
        print(f"  trace      : {multi['trace']}")
    for line in multi["boundaries"] or []:
        print(f"  {line}")
    print(f"  single-turn: {single['seconds']:.3f} s, {single_rate:.0f} new tok/s "
          f"({shape.num_prompts} x {shape.samples} x {shape.turns * shape.turn_tokens} tokens)")
    print(f"  ratio      : {result['ratio']:.1%} of single-turn tok/s (goal >= 85%)")
    return result


if __name__ == "__main__":
    main()
