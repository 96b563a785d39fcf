"""Token-exact episodes: prompt ids + sampled ids + observation ids (+ sampled ids ...) equal transformers'
tokenisation of the whole conversation rendered by the chat template (Qwen3 and Llama 3 styles, and
SmolLM2's real template), the model's own tokens are never changed where the template rewrites earlier
turns, and templates that cannot be continued are refused."""

import json

import pytest

from barerl.tokenizer import Tokenizer, load_tokenizer
from barerl.train.chat_turns import TemplatePrefixError, observation_token_ids, prompt_token_ids

transformers = pytest.importorskip("transformers")

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "description": "A."},
                                     "b": {"type": "integer", "description": "B."}}, "required": ["a", "b"]}}}]


def _call(a, b):
    return '<tool_call>\n' + json.dumps({"name": "add", "arguments": {"a": a, "b": b}}) + '\n</tool_call>'


@pytest.fixture
def tokenizers(tmp_path, chat_style, styled_chat_tokenizer):
    folder = styled_chat_tokenizer(tmp_path / chat_style, chat_style)
    return Tokenizer.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(folder)


def _play(tok, messages, turns, **template_kwargs):
    """Run an episode as the rollout loop will: turns are (model text, environment messages) pairs."""
    ids = prompt_token_ids(tok, messages, **template_kwargs)
    history = list(messages)
    for text, observation in turns:
        sampled = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        ids += sampled
        history.append({"role": "assistant", "content": text})
        if observation:
            ids += observation_token_ids(tok, history, observation, turn_ids=sampled, **template_kwargs)
            history += observation
    return ids, history


def _oracle(hf, history, **template_kwargs):
    """transformers' ids of the whole conversation, up to the end of the last turn's end-of-turn token."""
    ids = hf.apply_chat_template(history, return_dict=False, **template_kwargs)
    last_eos = max(i for i, t in enumerate(ids) if t == hf.eos_token_id)
    return ids[: last_eos + 1]


def test_tool_episode_is_the_templates_rendering(tokenizers, chat_style):
    """Three turns, one with two calls (Qwen3 groups their results in one user turn), each thinking first
    (a thinking model's turns; Qwen3's template keeps them after the last user message)."""
    ours, hf = tokenizers
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1+2 and 3+4?"}]
    turns = [(f"<think>\nTwo sums.\n</think>\n\n{_call(1, 2)}\n{_call(3, 4)}",
              [{"role": "tool", "content": "3"}, {"role": "tool", "content": "7"}]),
             (f"<think>\nNow add them.\n</think>\n\n{_call(3, 7)}", [{"role": "tool", "content": "10"}]),
             ("<think>\nDone.\n</think>\n\nThe answers are 3 and 7.", None)]
    ids, history = _play(ours, messages, turns, tools=TOOLS)
    assert ids == _oracle(hf, history, tools=TOOLS)


def test_qwen3_rewrites_of_earlier_turns_do_not_reach_the_observation(tmp_path, styled_chat_tokenizer):
    """Qwen3's template renders the final assistant turn with an (empty) think block and earlier ones
    without, and drops think blocks before the last user message: re-rendered histories are not prefixes.
    The observation is still the template's text after the turn, and the model's tokens stay as sampled."""
    tok = Tokenizer.from_pretrained(styled_chat_tokenizer(tmp_path, "qwen3"))
    history = [{"role": "user", "content": "What is 1+2?"}, {"role": "assistant", "content": _call(1, 2)}]
    tool = [{"role": "tool", "content": "3"}]
    alone = tok.apply_chat_template(history, tokenize=False, enable_thinking=False)
    followed = tok.apply_chat_template(history + tool, tokenize=False, enable_thinking=False)
    assert not followed.startswith(alone)  # why diffing whole renderings fails on Qwen3
    sampled = tok.encode(_call(1, 2), add_special_tokens=False) + [tok.eos_token_id]
    ids = observation_token_ids(tok, history, tool, turn_ids=sampled, enable_thinking=False)
    assert tok.decode(ids) == ("\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
                               "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    thinking = [{"role": "user", "content": "Guess."}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\n5"}]
    reply = [{"role": "user", "content": "Higher."}]
    assert "hm" not in tok.apply_chat_template(thinking + reply, tokenize=False)  # the old think is dropped
    ids = observation_token_ids(tok, thinking, reply, turn_ids=[tok.eos_token_id])
    assert tok.decode(ids) == "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"


def test_turn_without_its_end_of_turn_token_gets_it_from_the_template(tokenizers, chat_style):
    ours, _ = tokenizers
    history = [{"role": "user", "content": "Go."}, {"role": "assistant", "content": "cut off mid"}]
    truncated = ours.encode("cut off mid", add_special_tokens=False)  # stopped by max_tokens: no EOS
    ids = observation_token_ids(ours, history, [{"role": "user", "content": "Go on."}], turn_ids=truncated)
    assert ids[0] == ours.eos_token_id
    ended = truncated + [ours.eos_token_id]
    assert observation_token_ids(ours, history, [{"role": "user", "content": "Go on."}], turn_ids=ended) == ids[1:]


def test_smollm2_real_template_tool_role(smollm2_gguf_path, smollm2_hf_tokenizer):
    tok = load_tokenizer(smollm2_gguf_path)
    messages = [{"role": "user", "content": "What is 1+2? Use the calculator."}]
    ids, history = _play(tok, messages, [(_call(1, 2), [{"role": "tool", "content": "3"}]), ("It is 3.", None)])
    assert ids == _oracle(smollm2_hf_tokenizer, history)


LAST_TURN_ENDS_DIFFERENTLY = (
    "{% for m in messages %}{% if m.role == 'assistant' %}A: {{ m.content }}"
    "{% if loop.last %}</s>\n{% else %}</s>{% endif %}{% else %}U: {{ m.content }}\n{% endif %}{% endfor %}")
DROPS_EARLIER_ASSISTANT_TURNS = (
    "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}{{ m.role }}: {{ m.content }}\n"
    "{% endif %}{% endfor %}")


@pytest.mark.parametrize("template, message", [(LAST_TURN_ENDS_DIFFERENTLY, "ends the model's turn with"),
                                               (DROPS_EARLIER_ASSISTANT_TURNS, "does not render the model's last")])
def test_templates_that_cannot_continue_a_turn_are_refused(tmp_path, styled_chat_tokenizer, template, message):
    tok = Tokenizer.from_pretrained(styled_chat_tokenizer(tmp_path, "qwen3"))
    history = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    with pytest.raises(TemplatePrefixError, match=message):
        observation_token_ids(tok, history, [{"role": "user", "content": "Bye."}], chat_template=template)


def test_bad_histories_are_refused(tmp_path, styled_chat_tokenizer):
    tok = Tokenizer.from_pretrained(styled_chat_tokenizer(tmp_path, "qwen3"))
    with pytest.raises(ValueError, match="must end with the model's turn"):
        observation_token_ids(tok, [{"role": "user", "content": "Hi."}], [{"role": "user", "content": "?"}])
    with pytest.raises(ValueError, match="needs at least one message"):
        observation_token_ids(tok, [{"role": "assistant", "content": "Hi."}], [])
