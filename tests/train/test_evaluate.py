"""Evaluation: the pass@k estimator against hand-derived values, the scoring of given samples, and an
evaluation through a served barerl model scoring exactly as the in-process one for the same seeds (on the
CPU, and on the GPU engine)."""

import json
from math import comb

import numpy as np
import pytest

from barerl.cli import main
from barerl.train.evaluate import EvalConfig, OpenAISampler, evaluate, pass_at_k
from barerl.train.rewards import completion_text


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 2 / 5),
    (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
    (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
    (5, 2, 4, 1.0),  # n - c = 3 < k: any 4 samples hold a correct one
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (8, 0, 4, 0.0),
    (8, 8, 1, 1.0),
    (1, 1, 1, 1.0),
])
def test_pass_at_k_hand_derived(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_binomial_form_and_rejects_bad_counts():
    for n in range(1, 30):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)
    assert pass_at_k(200, 3, 100) == pytest.approx(1 - comb(197, 100) / comb(200, 100), rel=1e-12)
    for n, c, k in [(4, 5, 1), (4, 1, 5), (4, 1, 0)]:
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, c, k)


class GivenSamples:
    """A sampler returning fixed completions."""

    def __init__(self, texts):
        self.texts = texts

    def sample(self, prompts, cfg):
        return [[(t, "stop") for t in per_prompt] for per_prompt in self.texts]


def exact(prompts, completions, answer, **_):
    return [float(completion_text(c).strip() == a) for c, a in zip(completions, answer)]


def short(prompts, completions, **_):
    texts = [completion_text(c) for c in completions]
    return [None if not t else 1.0 / len(t) for t in texts]


def test_scores_pass_at_k_rewards_and_records():
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"},
            {"prompt": [{"role": "user", "content": "3+3="}], "answer": "6"}]
    texts = [["2", "3", "2", "2"], ["5", "5", "5", "5"], ["6", "", "7", "6"]]
    result = evaluate(GivenSamples(texts), rows, [exact, short], EvalConfig(n=4, pass_k=(1, 2, 4)))
    # correct: 3/4, 0/4, 2/4
    assert result.pass_at_k[1] == pytest.approx(np.mean([3 / 4, 0, 2 / 4]))
    assert result.pass_at_k[2] == pytest.approx(np.mean([1 - 0 / 6, 0, 1 - 1 / 6]))
    assert result.pass_at_k[4] == pytest.approx(2 / 3)
    assert result.accuracy == result.pass_at_k[1]
    assert result.rewards["exact"] == pytest.approx(5 / 12)
    assert result.rewards["short"] == pytest.approx(1.0)  # over the 11 samples it applies to
    assert len(result.samples) == 12
    record = result.samples[9]
    assert record == {"prompt_index": 2, "sample_index": 1, "prompt": rows[2]["prompt"], "completion": "",
                      "finish_reason": "stop", "rewards": {"exact": 0.0, "short": None}, "reward": 0.0,
                      "correct": False, "row": {"answer": "6"}}
    assert EvalConfig(n=8).ks == (1, 8)
    with pytest.raises(ValueError, match="pass_k"):
        EvalConfig(n=2, pass_k=(4,))


def vowels(prompts, completions, **_):
    return [float(any(ch in "aeiouAEIOU" for ch in completion_text(c))) for c in completions]


def test_a_served_model_scores_as_the_in_process_engine(chat_llm, openai_server, tmp_path, capsys):
    pytest.importorskip("openai")
    rows = [{"prompt": f"Prompt number {i}:"} for i in range(5)]
    rows += [{"prompt": [{"role": "user", "content": f"Question {i}?"}]} for i in range(3)]
    cfg = EvalConfig(n=4, temperature=1.0, max_tokens=10, seed=3, concurrency=3)
    llm = chat_llm()
    in_process = evaluate(llm, rows, [vowels], cfg)
    with openai_server(llm) as url:
        served = evaluate(OpenAISampler(url), rows, [vowels], cfg)
        data = tmp_path / "prompts.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        out = tmp_path / "samples.jsonl"
        code = main(["eval", "--base_url", url, "--dataset", str(data), "--reward_funcs", f"{__file__}:vowels",
                     "--n", "4", "--temperature", "1.0", "--max_tokens", "10", "--seed", "3",
                     "--output", str(out)])
    assert [s["completion"] for s in served.samples] == [s["completion"] for s in in_process.samples]
    assert served.pass_at_k == in_process.pass_at_k and served.rewards == in_process.rewards
    assert 0 < in_process.pass_at_k[1] < in_process.pass_at_k[4]
    assert code == 0
    assert [json.loads(line)["completion"] for line in out.read_text().splitlines()] == [
        s["completion"] for s in in_process.samples]
    stdout = capsys.readouterr().out
    assert f"pass@4 {in_process.pass_at_k[4]:.1%}" in stdout and "on 8 prompts x 4 samples" in stdout


@pytest.mark.gpu
def test_evaluation_runs_on_the_gpu_engine(chat_llm, openai_server):
    """`evaluate` over the GPU engine (bf16, batch-invariant kernels, CUDA graphs) and over the same engine
    served: the same samples, pass@k and rewards."""
    pytest.importorskip("openai")
    rows = [{"prompt": f"Prompt number {i}:"} for i in range(4)]
    rows += [{"prompt": [{"role": "user", "content": f"Question {i}?"}]} for i in range(2)]
    cfg = EvalConfig(n=4, temperature=1.0, max_tokens=16, seed=5, concurrency=3)
    llm = chat_llm(device="cuda", dtype="bfloat16", batch_invariant=True)
    assert llm.model.device == "cuda"
    in_process = evaluate(llm, rows, [vowels], cfg)
    with openai_server(llm) as url:
        served = evaluate(OpenAISampler(url), rows, [vowels], cfg)
    assert [s["completion"] for s in served.samples] == [s["completion"] for s in in_process.samples]
    assert served.pass_at_k == in_process.pass_at_k and served.rewards == in_process.rewards
    assert len(in_process.samples) == 24


def test_eval_command_errors(tmp_path, capsys):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    assert main(["eval", "--dataset", str(data), "--reward_funcs", "math_accuracy"]) == 1
    assert "--model (generate in this process) or --base_url" in capsys.readouterr().err
    assert main(["eval", "--model", "m", "--dataset", str(data), "--reward_funcs", "x", "--n", "2",
                 "--pass_k", "4"]) == 1
    assert "pass_k: each k must be <= n=2" in capsys.readouterr().err
