"""Token ids of a multi-turn episode: the environment's messages rendered by the model's own chat template,
appended to the sequence without re-tokenising anything before them.

An episode is one token sequence: the prompt's ids (`prompt_token_ids`), then the ids the model sampled,
then the ids of the environment's answer (`observation_token_ids`), then sampled ids again, and so on.
The trained ids are exactly the sampled ones plus the environment's, in order: nothing is ever decoded
and encoded again, so no token the model produced can change (re-tokenising a conversation merges or
splits tokens at message boundaries, and templates rewrite earlier turns).

How the environment's ids are found: render the conversation with the template twice, without and with
the new messages (the second time with the generation prompt), and keep what the second rendering adds
after the model's last turn. The model's turns are replaced by placeholders in both renderings, so that
the template's handling of earlier turns cannot reach the result: Qwen3's template drops the <think>
block of turns before the last user message and gives only the final assistant turn an (empty) think
block, so its rendering of the history is not a prefix of its rendering with one more message, and
diffing whole renderings fails on every Qwen3 tool turn. barerl keeps the model's own tokens (its think
blocks included) in the sequence, which is what it saw while sampling; a re-rendered conversation, as a
later inference request would send it, can differ from the sequence in those earlier turns, not in the
new messages.

What is refused (`TemplatePrefixError`): a template that does not render the model's last turn verbatim,
and one whose text after the last turn is not a prefix of its text after that turn once messages follow
(it would end the turn differently depending on what comes next); no appended ids could then continue
the sampled sequence as the template renders the conversation. Pass a corrected `chat_template`.
"""

from __future__ import annotations

from collections.abc import Sequence

_PLACEHOLDER = "BARERL_MODEL_TURN_{}"  # stands for an assistant turn's content in renderings


class TemplatePrefixError(ValueError):
    """The chat template cannot render an observation as a continuation of the model's last turn."""


def prompt_token_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None, **template_kwargs) -> list[int]:
    """The first turn's prompt: the template's rendering with the generation prompt."""
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools or None,
                                              **template_kwargs))


def _with_placeholders(messages: Sequence[dict]) -> tuple[list[dict], str]:
    """The messages with each assistant turn's content replaced by a placeholder; the last placeholder."""
    out, last = [], None
    for message in messages:
        if message.get("role") == "assistant":
            last = _PLACEHOLDER.format(len(out))
            message = {"role": "assistant", "content": last}
        out.append(message)
    return out, last


def _text_after(rendered: str, placeholder: str, what: str) -> str:
    if rendered.count(placeholder) != 1:
        raise TemplatePrefixError(f"the chat template does not render the model's last turn verbatim in {what}, "
                                  "so its tokens cannot be continued; pass a chat_template that renders "
                                  "assistant messages' content as it is")
    return rendered[rendered.index(placeholder) + len(placeholder):]


def observation_text(tokenizer, history_messages: Sequence[dict], new_messages: Sequence[dict],
                     tools: list[dict] | None = None, **template_kwargs) -> str:
    """The template's text from the end of the model's last turn (the last message of history_messages)
    through the new messages and the next generation prompt."""
    if not history_messages or history_messages[-1].get("role") != "assistant":
        raise ValueError("history_messages must end with the model's turn (a message with role 'assistant')")
    if not new_messages:
        raise ValueError("new_messages is empty: an observation needs at least one message")
    history, last = _with_placeholders(history_messages)
    tools = tools or None
    before = tokenizer.apply_chat_template(history, tokenize=False, tools=tools, **template_kwargs)
    after = tokenizer.apply_chat_template(history + list(new_messages), tokenize=False, add_generation_prompt=True,
                                          tools=tools, **template_kwargs)
    end_of_turn = _text_after(before, last, "the history")
    continued = _text_after(after, last, "the history with the new messages")
    if not continued.startswith(end_of_turn):
        raise TemplatePrefixError(
            f"the chat template ends the model's turn with {end_of_turn!r} when it is last but with "
            f"{continued[:len(end_of_turn) + 20]!r}... when messages follow it, so no tokens appended after the "
            "turn give the template's rendering; pass a chat_template that ends turns the same way")
    return continued


def _overlap(turn_ids: Sequence[int], ids: list[int], special: set[int]) -> int:
    """How many leading ids are special tokens the turn already ends with (its end-of-turn token)."""
    for k in range(min(len(turn_ids), len(ids)), 0, -1):
        if list(turn_ids[-k:]) == ids[:k] and all(i in special for i in ids[:k]):
            return k
    return 0


def observation_token_ids(tokenizer, history_messages: Sequence[dict], new_messages: Sequence[dict], *,
                          turn_ids: Sequence[int] = (), tools: list[dict] | None = None,
                          **template_kwargs) -> list[int]:
    """The ids to append after the model's turn: the new messages as the template renders them after the
    history, through the next generation prompt (see the module docstring).

    turn_ids: the ids the model sampled in its last turn. When the turn ended with the template's end-of-turn
    token (its EOS, e.g. <|im_end|>), that token is in the sequence already and is not appended again; a
    turn cut by max_tokens or a stop string gets it from here. tools / template_kwargs (enable_thinking=...)
    must be those the prompt was rendered with.
    """
    text = observation_text(tokenizer, history_messages, new_messages, tools, **template_kwargs)
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return ids[_overlap(turn_ids, ids, set(tokenizer.all_special_ids)):]
