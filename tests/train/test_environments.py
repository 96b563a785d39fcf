"""Environments: the documented example runs, ToolEnvironment answers each call (errors and timeouts
included) and ends on a turn without one, failed steps end their episode instead of the run, specs load
from files, and the config refuses what it cannot do."""

import textwrap
import time

import pytest

from barerl.train import environments
from barerl.train.config import ConfigError
from barerl.train.environments import (
    Environment,
    EnvironmentConfig,
    EnvironmentSetupError,
    Observation,
    ToolEnvironment,
    finished_step,
    load_environment_factory,
    prompt_messages,
)
from barerl.train.tools import load_tools
from barerl.train.worker_pool import WorkerPool


def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: First.
        b: Second.
    """
    return a + b


def nap(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "rested"


def _documented_example() -> str:
    """The worked example of environments.py's docstring (the same text as docs/ENVIRONMENTS.md's)."""
    doc = environments.__doc__
    start = doc.index("    from barerl.train.environments import")
    end = doc.index("Named in YAML")
    return textwrap.dedent(doc[start:end])


def _call(name, **arguments):
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture
def pool():
    with WorkerPool(4) as pool:
        yield pool


def test_documented_example_plays_an_episode(tmp_path):
    path = tmp_path / "guess.py"
    path.write_text(_documented_example())
    factory = load_environment_factory(EnvironmentConfig(environment_factory=f"{path}:GuessTheNumber"))
    env = factory()
    assert env.reset({"secret": 42})[0]["role"] == "user"
    assert env.step("50").messages == [{"role": "user", "content": "No: lower."}]
    assert env.step("forty").messages[0]["content"] == "A number only, please."
    final = env.step("42")
    assert final.done and final.reward == pytest.approx(1 / 3) and final.messages == []
    assert factory() is not env  # a fresh environment per episode


def test_tool_environment_answers_each_call_in_order(pool):
    env = ToolEnvironment(load_tools([add, nap]), pool, EnvironmentConfig(tool_timeout=0.3))
    assert [t["function"]["name"] for t in env.tools] == ["add", "nap"]
    assert env.reset({"prompt": "What is 1+2?"}) == [{"role": "user", "content": "What is 1+2?"}]
    turn = f"{_call('add', a=1, b=2)}\n{_call('nap', seconds=5)}\n{_call('mul', a=1)}\n<tool_call>oops</tool_call>"
    start = time.monotonic()
    observation = env.step(turn)
    assert time.monotonic() - start < 2  # the sleeping call timed out; it did not hold the turn
    assert not observation.done and [m["role"] for m in observation.messages] == ["tool"] * 4
    contents = [m["content"] for m in observation.messages]
    assert contents[0] == "3" and "nap timed out after 0.3s" in contents[1]
    assert "unknown tool 'mul'" in contents[2] and "not valid JSON" in contents[3]
    assert observation.info["tool_calls"] == 4 and observation.info["tool_errors"] == 3


def test_tool_environment_ends_on_an_answer_and_limits_calls(pool):
    env = ToolEnvironment(load_tools([add]), pool, EnvironmentConfig(max_tool_calls_per_turn=2))
    assert env.step("The answer is 3.") == Observation(done=True)
    observation = env.step(_call("add", a=1, b=1) * 3)
    assert [m["content"] for m in observation.messages][:2] == ["2", "2"]
    assert "at most 2 tool calls" in observation.messages[2]["content"]


def test_long_tool_responses_are_cut(pool):
    def echo(text: str) -> str:
        """Echo.

        Args:
            text: What.
        """
        return text

    env = ToolEnvironment(load_tools([echo]), pool, EnvironmentConfig(max_tool_response_chars=16))
    content = env.step(_call("echo", text="x" * 100)).messages[0]["content"]
    assert content == "x" * 16 + "\n[... 84 characters cut]"


def test_failed_steps_end_the_episode_not_the_run():
    class Broken(Environment):
        def step(self, text):
            raise RuntimeError("lost the board")

    class Slow(Environment):
        def step(self, text):
            time.sleep(2)
            return Observation()

    with WorkerPool(2) as pool:
        jobs = [pool.submit(Broken().step, "x", timeout=5), pool.submit(Slow().step, "x", timeout=0.2),
                pool.submit(lambda text: "not an observation", "x"), pool.submit(Environment().step, "x")]
        pool.run_all([(time.sleep, (0.3,))])
        outcomes = [finished_step(job) for job in jobs]
    assert all(o.done for o in outcomes)
    errors = [o.info["environment_error"] for o in outcomes]
    assert errors[0] == "RuntimeError: lost the board" and errors[1] == "step timed out after 0.2s"
    assert "returned str, not an Observation" in errors[2] and "must define step" in errors[3]


def test_prompt_messages_forms():
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert prompt_messages({"prompt": messages}) == messages
    with pytest.raises(EnvironmentSetupError, match="needs a 'prompt'"):
        prompt_messages({"question": "u"})


def test_config_errors_are_clear():
    with pytest.raises(ConfigError, match="environment_factory and tools: set one, not both"):
        EnvironmentConfig(environment_factory="m:C", tools=("python",))
    with pytest.raises(ConfigError, match="sandbox_require: must be one of"):
        EnvironmentConfig(sandbox_require=("gpu",))
    assert EnvironmentConfig(max_turns="3", tools="a.py:f,python").tools == ("a.py:f", "python")
    with pytest.raises(EnvironmentSetupError, match="no environment"):
        load_environment_factory(EnvironmentConfig())
    with pytest.raises(EnvironmentSetupError, match="has no class 'Nope'"):
        load_environment_factory(EnvironmentConfig(environment_factory="barerl.train.environments:Nope"))


def test_episodes_interleave_while_tools_run(tmp_path, styled_chat_tokenizer):
    """The rollout loop's pattern: submit a turn's step, keep going with the other episodes, poll; the
    episode's ids are its prompt, its sampled ids and the observation ids, in order."""
    from barerl.tokenizer import Tokenizer
    from barerl.train.chat_turns import observation_token_ids, prompt_token_ids

    tok = Tokenizer.from_pretrained(styled_chat_tokenizer(tmp_path, "llama3"))
    factory = load_environment_factory(EnvironmentConfig(tools=("tests.train.test_environments:nap",)))
    scripts = {0: [_call("nap", seconds=0.5), "Slept."], 1: ["No tool needed."], 2: [_call("nap", seconds=0), "Ok."]}
    episodes = {}
    for key in scripts:
        env = factory()
        messages = env.reset({"prompt": f"Episode {key}."})
        episodes[key] = {"env": env, "history": messages, "ids": prompt_token_ids(tok, messages, env.tools),
                         "turn": 0, "done": False}
    with WorkerPool(4) as steps:
        order = []
        while not all(e["done"] for e in episodes.values()):
            for key, episode in episodes.items():  # "decode" one turn of every episode not waiting
                if episode["done"] or episode.get("waiting"):
                    continue
                text = scripts[key][episode["turn"]]
                sampled = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
                episode.update(ids=episode["ids"] + sampled, sampled=sampled, turn=episode["turn"] + 1, waiting=True)
                episode["history"].append({"role": "assistant", "content": text})
                steps.submit(episode["env"].step, text, key=key, timeout=5)
            for job in steps.wait(timeout=1):
                episode, observation = episodes[job.key], finished_step(job)
                order.append(job.key)
                episode["waiting"] = False
                if observation.done:
                    episode["done"] = True
                    continue
                episode["ids"] += observation_token_ids(tok, episode["history"], observation.messages,
                                                        turn_ids=episode["sampled"], tools=episode["env"].tools)
                episode["history"] += observation.messages
    assert order.index(0) > order.index(1)  # episode 0's slow tool did not hold the others back
    for episode in episodes.values():
        expected = tok.apply_chat_template(episode["history"], tools=episode["env"].tools)
        assert episode["ids"] == expected
