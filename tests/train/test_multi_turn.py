"""Multi-turn episodes in the engine's step loop: the trained ids are the sampled ids plus the environment's
(hand-derived renderings, transformers' tokenisation) for Qwen-style and Llama-style templates, with loss
only on sampled tokens; seeds do not depend on grouping or timing; episodes interleave while environments
run; limits end episodes as recorded; continued turns find their KV in the prefix cache."""

import time

import numpy as np
import pytest

from barerl.config import ModelConfig
from barerl.engine.engine import Engine
from barerl.engine.llm import LLM
from barerl.engine.sampling_params import SamplingParams
from barerl.model.model import Model
from barerl.tokenizer import Tokenizer
from barerl.train import episode_loop
from barerl.train.config import GRPOConfig
from barerl.train.environments import Environment, Observation
from barerl.train.episode import ENVIRONMENT_TOKEN, ChatTokens, Episode
from barerl.train.episode_loop import EpisodeLoop, LoopStats, turn_seed
from barerl.train.episode_metrics import EpisodeStats
from barerl.train.multi_turn import MultiTurnRollouts
from barerl.train.rewards import RewardRunner
from barerl.train.rollouts import train_batches
from barerl.train.worker_pool import WorkerPool

ADD_SCHEMA = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "description": "A."},
                                     "b": {"type": "integer", "description": "B."}}, "required": ["a", "b"]}}}
RESULTS = ("5", "x=3")  # the two tool messages each step answers with


class ToolAnswers(Environment):
    """Answers every turn with two tool messages, for three turns; reports one failed call of two."""

    tools = [ADD_SCHEMA]  # noqa: RUF012

    def reset(self, row):
        self.steps = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        self.steps += 1
        messages = [{"role": "tool", "content": content} for content in RESULTS]
        return Observation(messages, done=self.steps == 3, info={"tool_calls": 2, "tool_errors": 1})


class Chatty(Environment):
    """A user who always wants more, after `nap` seconds; each step is logged as (name, turn) when it starts."""

    def __init__(self, name, nap=0.0, log=None):
        self.name, self.nap, self.log, self.turn = name, nap, log if log is not None else [], 0

    def step(self, text):
        self.log.append((self.name, self.turn))
        self.turn += 1
        time.sleep(self.nap)
        return Observation([{"role": "user", "content": "More."}])


def _hand_observation(style: str) -> str:
    """What the template adds after a model turn that two tool messages answer (from the .jinja files)."""
    if style == "qwen3":
        responses = "".join(f"\n<tool_response>\n{r}\n</tool_response>" for r in RESULTS)
        return f"<|im_end|>\n<|im_start|>user{responses}<|im_end|>\n<|im_start|>assistant\n"
    headers = "".join(f"<|start_header_id|>ipython<|end_header_id|>\n\n{r}<|eot_id|>" for r in RESULTS)
    return f"<|eot_id|>{headers}<|start_header_id|>assistant<|end_header_id|>\n\n"


def eos_prone_model(tokenizer, seed=0) -> Model:
    """A tiny random model whose head favours EOS at about a quarter of the positions (uniform elsewhere), so
    turns end both with EOS and at their length limit."""
    cfg = ModelConfig.from_dict({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": tokenizer.vocab_size, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "tie_word_embeddings": False, "max_position_embeddings": 2048,
        "eos_token_id": tokenizer.eos_token_id,
    })
    model = Model.random(cfg, seed=seed)
    head = model.params["lm_head.weight"]
    head[...] = 0.0
    head[tokenizer.eos_token_id] = np.random.default_rng(seed).standard_normal(cfg.hidden_size)
    return model


def record_finished_turns(monkeypatch) -> list:
    """Every finished engine sequence, as (prompt ids, sampled ids, log-probs): the oracle of what was sampled."""
    records, step = [], Engine.step

    def recording_step(self, *args, **kwargs):
        sampled = step(self, *args, **kwargs)
        for seq in {s.seq_id: s for s in sampled if s.is_finished}.values():
            prompt = seq.token_ids[:seq.num_prompt_tokens]
            records.append((prompt, list(seq.output_token_ids), list(seq.output_logprobs)))
        return sampled

    monkeypatch.setattr(Engine, "step", recording_step)
    return records


def runs(turns: list[int]) -> list[tuple[int, int, int]]:
    """(turn, start, end) of each run of equal turn indices."""
    out, start = [], 0
    for i in range(1, len(turns) + 1):
        if i == len(turns) or turns[i] != turns[start]:
            out.append((turns[start], start, i))
            start = i
    return out


def test_trained_ids_are_the_sampled_ids_plus_the_environments(tmp_path, styled_chat_tokenizer, chat_style,
                                                               monkeypatch):
    transformers = pytest.importorskip("transformers")
    folder = styled_chat_tokenizer(tmp_path / "tok", chat_style)
    tok, hf = Tokenizer.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(folder)
    records = record_finished_turns(monkeypatch)
    llm = LLM(eos_prone_model(tok), tok, max_model_len=1024, num_kv_blocks=1024, max_num_seqs=16)
    cfg = GRPOConfig(environment_factory="tests.train.test_multi_turn:ToolAnswers", num_generations=4,
                     max_turns=3, max_tokens_per_turn=6, max_completion_length=200, max_prompt_length=None,
                     per_device_train_batch_size=8, seed=2)
    rows = [{"prompt": "What is 2 + 3?"}, {"prompt": "Solve x + 1 = 4."}]
    with RewardRunner([]) as runner:
        rollouts = MultiTurnRollouts(cfg, tok, 8)(llm, tok, rows, cfg, step=0, runner=runner)
    observation = hf.encode(_hand_observation(chat_style), add_special_tokens=False)
    ended_with_eos = 0
    for i, row in enumerate([r for r in rows for _ in range(cfg.num_generations)]):
        text = hf.apply_chat_template([{"role": "user", "content": row["prompt"]}], tools=[ADD_SCHEMA],
                                      add_generation_prompt=True, tokenize=False)
        prompt = hf.encode(text, add_special_tokens=False)
        assert rollouts.prompt_ids[i] == prompt
        ids, turns, logprobs = rollouts.prompt_ids[i] + rollouts.completion_ids[i], rollouts.completion_turns[i], \
            rollouts.engine_logprobs[i]
        offset, previous = len(prompt), None
        for turn, start, end in runs(turns):
            piece = rollouts.completion_ids[i][start:end]
            if turn == ENVIRONMENT_TOKEN:  # the hand-derived rendering, its end-of-turn token once
                eos = previous[-1] == tok.eos_token_id
                ended_with_eos += eos
                assert piece == observation[1:] if eos else observation
                assert logprobs[start:end] == [0.0] * (end - start)
            else:  # exactly what the engine sampled for a request whose prompt was everything before
                assert (ids[:offset + start], piece, logprobs[start:end]) in records
                previous = piece
        assert turns[-1] != ENVIRONMENT_TOKEN and max(turns) == rollouts.episodes.num_turns[i] - 1
    assert 0 < ended_with_eos < 16  # both kinds of turn ends were seen
    # only the sampled tokens carry loss, each with its engine log-prob
    [batch] = train_batches(rollouts, list(range(len(rollouts))), 64, None, mask_truncated=False)
    for i, start in enumerate(batch.batch.cu_seqlens[:-1]):
        p, c = len(rollouts.prompt_ids[i]), len(rollouts.completion_ids[i])
        targets = slice(start + p - 1, start + p - 1 + c)
        sampled = np.array(rollouts.completion_turns[i]) >= 0
        np.testing.assert_array_equal(batch.batch.loss_mask[targets], sampled)
        np.testing.assert_array_equal(batch.batch.loss_mask[start:start + p - 1], 0)
        np.testing.assert_array_equal(batch.engine_logp[targets], np.float32(rollouts.engine_logprobs[i]))
        np.testing.assert_array_equal(batch.turns[targets], rollouts.completion_turns[i])
    metrics = rollouts.episodes.metrics()
    assert metrics["tools/failure_frequency"] == 0.5
    assert metrics["tools/call_frequency"] == 2 * rollouts.episodes.num_turns.mean()
    assert metrics["engine/prefix_cache_hit_rate"] == 1.0  # every earlier turn's full block was found again


def chat_episodes(tok, groups: int, size: int, budget=120, max_turns=4, first_nap=0.0, log=None):
    """Groups of Chatty episodes over the tiny chat tokenizer, named (g, i); group g's seed is 100 + g; the
    very first episode's steps take `first_nap` seconds."""
    tokens, out = ChatTokens(tok), []
    for g in range(groups):
        group = []
        for i in range(size):
            env = Chatty((g, i), first_nap if (g, i) == (0, 0) else 0.0, log)
            messages = env.reset({"prompt": f"Tell me about {g}."})
            group.append(Episode(env, tokens, messages, tokens.prompt(messages, []), budget, max_turns, 100 + g, i))
        out.append(group)
    return out


def play(llm, groups, max_tokens=8, **sampling):
    with WorkerPool(16) as steps:
        params = SamplingParams(temperature=1.0, max_tokens=max_tokens, **sampling)
        return EpisodeLoop(llm.engine, steps, params, step_timeout=10).run(groups)


def test_seeds_depend_on_the_sample_and_turn_only(chat_llm, chat_tokenizer):
    """Episodes played as groups (one n-sample request for their first turns) or one by one sample the same
    tokens; a group's first turns are what generate() samples from the group's seed."""
    grouped, alone = chat_episodes(chat_tokenizer, 2, 3), chat_episodes(chat_tokenizer, 2, 3)
    play(chat_llm(), grouped)
    play(chat_llm(), [[e] for group in alone for e in group])
    for a, b in zip([e for g in grouped for e in g], [e for g in alone for e in g]):
        assert a.completion_ids == b.completion_ids and a.turns == b.turns
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    first = grouped[0][0]
    [out] = chat_llm().generate([first.prompt_ids], SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=100),
                                use_tqdm=False)
    for episode, sample in zip(grouped[0], out.outputs):
        assert episode.completion_ids[:len(sample.token_ids)] == sample.token_ids
    assert turn_seed(100, 1, 0) != turn_seed(100, 1, 1) != turn_seed(100, 2, 1)


def test_episodes_decode_while_one_waits_for_its_environment(chat_llm, chat_tokenizer):
    log = []
    groups = chat_episodes(chat_tokenizer, 1, 4, max_turns=3, first_nap=0.5, log=log)
    stats = play(chat_llm(), groups, ignore_eos=True)
    slow = log.index(((0, 0), 1))  # the slow episode's second step starts once its first is back
    assert {name for name, turn in log[:slow] if turn > 0} == {(0, 1), (0, 2), (0, 3)}  # the others went on
    assert all(e.end == "max_turns" for e in groups[0])
    # the engine idled only while every unfinished episode waited: at most the slow one's three naps
    assert 0.0 < stats.idle_seconds < 1.5 < stats.wall_seconds
    assert stats.engine_seconds + stats.idle_seconds <= stats.wall_seconds


def test_an_idle_loop_takes_in_the_steps_that_come_back_together(monkeypatch):
    """Once the engine idles, steps finishing within _GATHER_GAP of each other are taken in together (one
    admission step for their turns), and a straggler is not waited for."""
    monkeypatch.setattr(episode_loop, "_GATHER_GAP", 0.05)
    with WorkerPool(8) as pool:
        loop = EpisodeLoop(None, pool, SamplingParams())
        loop._pending = [pool.submit(time.sleep, 0.2 + 0.01 * i) for i in range(4)] + [pool.submit(time.sleep, 3.0)]
        start = time.perf_counter()
        ready = loop._ready_steps(wait=True)
        assert len(ready) == 4 and time.perf_counter() - start < 1.0
        assert loop._pending and not loop._pending[0].done


def test_limits_end_episodes_as_recorded(chat_llm, chat_tokenizer):
    by_turns = chat_episodes(chat_tokenizer, 1, 2, budget=400, max_turns=3)
    by_tokens = chat_episodes(chat_tokenizer, 1, 2, budget=30, max_turns=10)
    play(chat_llm(), by_turns + by_tokens, ignore_eos=True)
    for e in by_turns[0]:
        assert e.end == "max_turns" and e.num_turns == 3 and e.truncated
        assert all(n == 8 for n in np.bincount([t for t in e.turns if t >= 0]))  # max_tokens per turn
    for e in by_tokens[0]:
        assert e.end == "max_completion_length" and len(e.completion_ids) <= 30 and e.truncated
    metrics = EpisodeStats.from_episodes(by_turns[0] + by_tokens[0], LoopStats()).metrics()
    assert metrics["episodes/max_turns_ratio"] == 0.5 and metrics["episodes/max_completion_length_ratio"] == 0.5
    assert metrics["episodes/truncated_ratio"] == 1.0 and metrics["episodes/turns_max"] == 3


def test_failing_environments_end_their_episode_not_the_run(chat_llm, chat_tokenizer):
    class Broken(Environment):
        def step(self, text):
            raise RuntimeError("lost the board")

    class Silent(Environment):
        def step(self, text):
            return Observation()

    class Slow(Environment):
        def step(self, text):
            time.sleep(1.0)
            return Observation([{"role": "user", "content": "late"}])

    tokens = ChatTokens(chat_tokenizer)
    groups = []
    for i, env in enumerate((Broken(), Silent(), Slow())):
        messages = env.reset({"prompt": "Hi."})
        groups.append([Episode(env, tokens, messages, tokens.prompt(messages, []), 100, 4, i, 0)])
    with WorkerPool(4) as steps:
        EpisodeLoop(chat_llm().engine, steps, SamplingParams(max_tokens=4), step_timeout=0.2).run(groups)
    errors = [group[0].error for group in groups]
    assert [group[0].end for group in groups] == ["environment_error"] * 3
    assert errors[0] == "RuntimeError: lost the board" and "no messages" in errors[1]
    assert errors[2] == "step timed out after 0.2s"


def test_the_cache_hit_rate_counts_only_what_an_episodes_own_earlier_turns_left(chat_llm, chat_tokenizer):
    """Top-1 samples of one prompt are alike, so a later one's continued turn also finds blocks another sample
    computed after its own earlier turns (the environment's reply among them): those are not counted, and the
    rate stays a share (on the GPU it read 1.0013 before this was so)."""
    llm = chat_llm()
    groups = chat_episodes(chat_tokenizer, 1, 4, max_turns=3)
    stats = play(llm, groups, top_k=1)
    episodes = [e for g in groups for e in g]
    assert all(e.cached_tokens <= e.reusable_tokens for e in episodes) and sum(e.reusable_tokens for e in episodes)
    assert 0.9 <= EpisodeStats.from_episodes(episodes, stats).metrics()["engine/prefix_cache_hit_rate"] <= 1.0
