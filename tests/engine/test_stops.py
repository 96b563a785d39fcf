"""Stop conditions and text, as vLLM documents them: EOS, stop_token_ids, stop strings (cut from the text,
kept with include_stop_str_in_output), min_tokens, ignore_eos, max_tokens, max_model_len, streaming; each
with single decode steps and with lookahead (4 steps per runner call: tokens past a stop are dropped)."""

import pytest
from engine_helpers import CharTokenizer, scripted_model

from barerl import LLM, SamplingParams

TOK = CharTokenizer()
PROMPT = "ab"
HELLO = ["h", "e", "l", "lo w", "orld", "!"]  # "hello world!", then <eos>
ENGINE = {}


@pytest.fixture(autouse=True, params=[1, 4], ids=["single-steps", "lookahead-4"])
def num_scheduler_steps(request):
    ENGINE["num_scheduler_steps"] = request.param


def run(pieces, max_model_len=64, **params):
    model = scripted_model(TOK, pieces, len(PROMPT))
    llm = LLM(model, tokenizer=TOK, block_size=4, max_model_len=max_model_len, **ENGINE)
    params = {"temperature": 0, "max_tokens": 20, **params}
    [out] = llm.generate(PROMPT, SamplingParams(**params), use_tqdm=False)
    return out.outputs[0]


def test_eos_stops_and_stays_in_token_ids_but_not_in_text():
    c = run(["h", "i"])
    assert c.token_ids == TOK.ids("h", "i", "<eos>")
    assert (c.text, c.finish_reason, c.stop_reason) == ("hi", "stop", None)


def test_ignore_eos_runs_to_max_tokens():
    c = run(["h", "i"], ignore_eos=True, max_tokens=5)
    assert c.token_ids == TOK.ids("h", "i", "<eos>", "<eos>", "<eos>")
    assert (c.text, c.finish_reason) == ("hi", "length")
    c = run(["h", "i"], ignore_eos=True, max_tokens=3, skip_special_tokens=False)
    assert c.text == "hi<eos>"


def test_stop_token_ids():
    c = run(HELLO, stop_token_ids=TOK.ids("l"))
    assert c.token_ids == TOK.ids("h", "e", "l")
    assert (c.text, c.finish_reason, c.stop_reason) == ("he", "stop", TOK.ids("l")[0])
    assert run(HELLO, stop_token_ids=TOK.ids("l"), include_stop_str_in_output=True).text == "hel"


def test_stop_string_is_cut_from_the_text_even_inside_a_token():
    c = run(HELLO, stop="o w")
    assert c.token_ids == TOK.ids("h", "e", "l", "lo w")  # token ids keep the token that completed it
    assert (c.text, c.finish_reason, c.stop_reason) == ("hell", "stop", "o w")
    assert run(HELLO, stop="o w", include_stop_str_in_output=True).text == "hello w"


def test_stop_string_spanning_tokens_and_the_first_listed_match_wins():
    c = run(HELLO, stop=["xyz", "ld!"])
    assert (c.text, c.stop_reason, len(c.token_ids)) == ("hello wor", "ld!", 6)
    c = run(HELLO, stop=["world", "lo"])  # "lo" completes first (token 4): "world" never gets a chance
    assert (c.text, c.stop_reason) == ("hel", "lo")


def test_min_tokens_bans_eos_and_ignores_stop_strings_until_reached():
    c = run(["h", "i"], min_tokens=4)  # EOS masked for tokens 3 and 4: greedy takes the next best, "a"
    assert c.token_ids == TOK.ids("h", "i", "a", "a", "<eos>")
    assert c.text == "hiaa"
    c = run(["h", "i", "x", "i", "y"], stop="i", min_tokens=3)  # the first "i" is token 2 <= min_tokens
    assert (c.text, len(c.token_ids)) == ("hix", 4)
    c = run(HELLO, stop_token_ids=TOK.ids("e"), min_tokens=2)
    assert c.token_ids[:2] == TOK.ids("h", "a")


def test_max_tokens_and_max_model_len_end_with_length():
    c = run(HELLO, max_tokens=4)
    assert (c.text, c.finish_reason, c.stop_reason) == ("hello w", "length", None)
    c = run(HELLO, max_model_len=6, max_tokens=None)
    assert (len(c.token_ids), c.finish_reason) == (4, "length")


def test_a_stop_string_on_the_last_allowed_token_wins_over_length():
    c = run(HELLO, stop="o w", max_tokens=4)
    assert (c.text, c.finish_reason, c.stop_reason) == ("hell", "stop", "o w")


@pytest.mark.parametrize("stop", [None, "o w", "zz"])
def test_stream_never_shows_a_stop_string_and_adds_up_to_the_final_text(stop):
    model = scripted_model(TOK, HELLO, len(PROMPT))
    llm = LLM(model, tokenizer=TOK, block_size=4, max_model_len=64)
    params = SamplingParams(temperature=0, max_tokens=20, stop=stop)
    [final] = llm.generate(PROMPT, params, use_tqdm=False)
    deltas = [d.outputs[0].text for d in llm.stream(PROMPT, params)]
    assert "".join(deltas) == final.outputs[0].text
    if stop == "o w":
        assert "o" not in "".join(deltas)


def test_n_samples_each_get_their_own_text():
    model = scripted_model(TOK, HELLO, len(PROMPT))
    llm = LLM(model, tokenizer=TOK, block_size=4, max_model_len=64)
    [out] = llm.generate(PROMPT, SamplingParams(n=3, temperature=0, stop="o w"), use_tqdm=False)
    assert [c.text for c in out.outputs] == ["hell"] * 3
    assert out.prompt == PROMPT and out.prompt_token_ids == TOK.encode(PROMPT)
