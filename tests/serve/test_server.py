"""The OpenAI-compatible server driven by the official `openai` client on loopback: outputs equal
`LLM.generate` / `LLM.chat` for the same seeds, streamed deltas add up to the full response, the prefix cache
is kept across requests, and bad requests get OpenAI's error shape and status without hurting the server."""

import json

import numpy as np
import pytest

from barerl.engine.sampling_params import SamplingParams

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

MODEL = "tiny-chat"
PROMPTS = ["The weather today", "Once upon a time, there"]
CASES = {  # OpenAI request fields -> the SamplingParams they mean
    "greedy": ({"temperature": 0, "max_tokens": 12}, {"temperature": 0, "max_tokens": 12}),
    "seeded-n3-logprobs": ({"temperature": 1.0, "max_tokens": 10, "n": 3, "seed": 11},
                           {"temperature": 1.0, "max_tokens": 10, "n": 3, "seed": 11, "logprobs": True}),
    "stop-strings": ({"temperature": 0.9, "top_p": 0.9, "max_tokens": 40, "seed": 5, "stop": ["e", "a"]},
                     {"temperature": 0.9, "top_p": 0.9, "max_tokens": 40, "seed": 5, "stop": ["e", "a"]}),
}


def client_for(base_url):
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def logprobs_of(choice):
    if choice.logprobs is None:
        return None
    if hasattr(choice.logprobs, "token_logprobs"):
        return choice.logprobs.token_logprobs
    return [entry.logprob for entry in choice.logprobs.content]


def assert_close_lists(got, expected):
    """Log-probs of the same tokens: equal up to float rounding (a prompt served from the prefix cache is
    computed in other batch shapes)."""
    assert [len(g) for g in got] == [len(e) for e in expected]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def assert_same_samples(choices, expected_outputs):
    assert len(choices) == len(expected_outputs)
    for choice, expected in zip(choices, expected_outputs):
        text = choice.text if hasattr(choice, "text") else choice.message.content
        assert (text, choice.finish_reason) == (expected.text, expected.finish_reason)
        if expected.logprobs is not None:
            assert_close_lists([logprobs_of(choice)], [expected.logprobs])


@pytest.mark.parametrize("case", CASES)
def test_completions_equal_generate(case, chat_llm, openai_server):
    request, params = CASES[case]
    llm = chat_llm()
    expected = [llm.generate([p], SamplingParams(**params), use_tqdm=False)[0].outputs for p in PROMPTS]
    with openai_server(llm) as url:
        client = client_for(url)
        logprobs = 0 if "logprobs" in params else None
        for prompt, outputs in zip(PROMPTS, expected):
            response = client.completions.create(model=MODEL, prompt=prompt, logprobs=logprobs, **request)
            assert_same_samples(response.choices, outputs)
        if case == "stop-strings":
            assert {c.stop_reason for c in expected[0] + expected[1]} <= {"e", "a", None}
        # several prompts in one request: choices prompt-major, as OpenAI orders them
        response = client.completions.create(model=MODEL, prompt=PROMPTS, logprobs=logprobs, **request)
        assert_same_samples(response.choices, expected[0] + expected[1])


def test_chat_equals_llm_chat(chat_llm, openai_server):
    llm = chat_llm()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
    params = SamplingParams(temperature=1.0, max_tokens=16, n=2, seed=3, logprobs=True)
    [expected] = llm.chat(messages, params, use_tqdm=False)
    with openai_server(llm) as url:
        response = client_for(url).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=16, n=2, seed=3, logprobs=True)
    assert_same_samples(response.choices, expected.outputs)
    assert response.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert response.usage.completion_tokens == sum(len(o.token_ids) for o in expected.outputs)


def test_streamed_deltas_add_up_to_the_response(chat_llm, openai_server):
    with openai_server(chat_llm()) as url:
        client = client_for(url)
        request = {"model": MODEL, "max_tokens": 24, "n": 2, "seed": 7, "stop": ["q"]}
        full = client.completions.create(prompt=PROMPTS[0], logprobs=0, **request)
        texts, logprobs, finish = ["", ""], [[], []], [None, None]
        for chunk in client.completions.create(prompt=PROMPTS[0], logprobs=0, stream=True, **request):
            for choice in chunk.choices:
                texts[choice.index] += choice.text
                logprobs[choice.index] += choice.logprobs.token_logprobs
                finish[choice.index] = choice.finish_reason or finish[choice.index]
        assert texts == [c.text for c in full.choices]
        assert_close_lists(logprobs, [c.logprobs.token_logprobs for c in full.choices])
        assert finish == [c.finish_reason for c in full.choices]

        messages = [{"role": "user", "content": "Tell me a story."}]
        full = client.chat.completions.create(messages=messages, logprobs=True, **request)
        stream = client.chat.completions.create(messages=messages, logprobs=True, stream=True,
                                                stream_options={"include_usage": True}, **request)
        contents, logprobs, finish, usage = ["", ""], [[], []], [None, None], None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                contents[choice.index] += choice.delta.content or ""
                logprobs[choice.index] += [e.logprob for e in choice.logprobs.content] if choice.logprobs else []
                finish[choice.index] = choice.finish_reason or finish[choice.index]
        assert contents == [c.message.content for c in full.choices]
        assert_close_lists(logprobs, [logprobs_of(c) for c in full.choices])
        assert finish == [c.finish_reason for c in full.choices]
        assert usage.completion_tokens == full.usage.completion_tokens


def test_the_prefix_cache_is_kept_across_requests(chat_llm, openai_server):
    prompt = "A shared system prompt that many requests begin with, long enough to fill blocks. " * 2
    with openai_server(chat_llm()) as url:
        client = client_for(url)
        first, second = (client.completions.create(model=MODEL, prompt=prompt + tail, max_tokens=2, seed=0)
                         for tail in ("One", "Two"))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= 16 * (len(prompt) // 16) - 16


def test_models_health_and_api_key(chat_llm, openai_server):
    with openai_server(chat_llm(), api_key="secret") as url:
        assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            client_for(url).models.list()
        models = openai.OpenAI(base_url=url, api_key="secret").models.list()
    assert [m.id for m in models.data] == [MODEL]


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def test_bad_requests_get_openai_errors_and_the_server_goes_on(chat_llm, openai_server):
    with openai_server(chat_llm(max_num_seqs=8)) as url:
        client = client_for(url)

        def post(path, body):
            data = body if isinstance(body, (str, bytes)) else json.dumps(body)
            return httpx.post(url + path, content=data, headers={"content-type": "application/json"})

        with pytest.raises(openai.NotFoundError) as e:
            client.completions.create(model="no-such-model", prompt="hi")
        assert e.value.body["code"] == "model_not_found"
        for bad, param in [
            ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
            ({"prompt": "hi", "max_tokens": 511}, "max_tokens"),  # prompt + completion over the context
            ({"prompt": "x" * 600}, "max_tokens"),  # the prompt alone is
            ({"prompt": "hi", "n": 9}, None),  # more than max_num_seqs
            ({"prompt": "hi", "logprobs": 5}, "logprobs"),
            ({"prompt": "hi", "temperature": "hot"}, "temperature"),
            ({"prompt": "hi", "presence_penalty": 0.5}, "presence_penalty"),
            ({"prompt": []}, "prompt"),
            ({"prompt": [5, 999]}, None),  # a token id outside the vocabulary
        ]:
            assert error_of(post("/completions", {"model": MODEL, **bad}), 400)["param"] == param, bad
        assert error_of(post("/chat/completions", "{not json"), 400)["type"] == "invalid_request_error"
        assert error_of(post("/chat/completions", "[1, 2]"), 400)
        assert error_of(post("/chat/completions", {"messages": []}), 400)["param"] == "messages"
        assert error_of(post("/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                   "tool_choice": "required"}), 400)["param"] == "tool_choice"
        assert error_of(httpx.get(url + "/nothing-here"), 404)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 600}])
        response = client.completions.create(model=MODEL, prompt="still serving", max_tokens=3)
        assert response.choices[0].finish_reason in ("length", "stop")


def test_a_failed_engine_step_fails_its_requests_not_the_server(chat_llm, openai_server):
    llm = chat_llm()
    launch, calls = llm.engine.runner.launch, []

    def launch_once_broken(batch):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated device fault")
        return launch(batch)

    llm.engine.runner.launch = launch_once_broken
    with openai_server(llm) as url:
        client = client_for(url)
        with pytest.raises(openai.InternalServerError, match="simulated device fault"):
            client.completions.create(model=MODEL, prompt="first", max_tokens=4)
        stream = client.completions.create(model=MODEL, prompt="second", max_tokens=4, stream=True)
        assert sum(len(chunk.choices[0].text) for chunk in stream if chunk.choices) >= 1


def test_serve_command_end_to_end(tmp_path, chat_llm, chat_tokenizer):
    """`barerl serve` in a process of its own: it loads the folder, listens, and answers the client."""
    import socket
    import subprocess
    import sys
    import time

    from barerl.model.checkpoint import save_checkpoint

    model = chat_llm().model
    save_checkpoint(tmp_path / "model", model.cfg, model.params, tokenizer=chat_tokenizer)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "barerl.cli", "serve", "--model", str(tmp_path / "model"),
               "--served-model-name", MODEL, "--port", str(port), "--max-model-len", "256",
               "--num-kv-blocks", "64", "--log-level", "warning"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "barerl serve did not start"
                time.sleep(0.2)
        response = client_for(url + "/v1").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert response.choices[0].finish_reason in ("length", "stop") and response.usage.completion_tokens >= 1
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.gpu
def test_completions_equal_generate_on_the_gpu(chat_llm, openai_server):
    """The server over the GPU engine (bf16, batch-invariant kernels, CUDA graphs) answers as LLM.generate
    does: the engine thread launches on the GPU as the main thread did."""
    llm = chat_llm(device="cuda", dtype="bfloat16", batch_invariant=True)
    assert llm.model.device == "cuda"
    params = SamplingParams(temperature=1.0, max_tokens=32, n=4, seed=9, logprobs=True)
    expected = [llm.generate([p], params, use_tqdm=False)[0].outputs for p in PROMPTS]
    with openai_server(llm) as url:
        client = client_for(url)
        for prompt, outputs in zip(PROMPTS, expected):
            response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, n=4, seed=9,
                                                 logprobs=0)
            assert_same_samples(response.choices, outputs)
