"""Tool calls through the server: a scripted model writes a fixed reply in the Hermes / Qwen format, and the
`openai` client gets it back as `tool_calls`, whole or streamed; malformed calls and tool_choice="none" come
back as plain content; a conversation carrying earlier calls renders with the chat template."""

import json

import pytest
from engine_helpers import PagedMockModel

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def scripted_llm(chat_llm, chat_tokenizer):
    """Factory: an LLM over the chat tokenizer whose every assistant turn is `reply`, then <|im_end|>."""
    return lambda reply: chat_llm(model=scripted_model(chat_tokenizer, reply))


def scripted_model(tokenizer, reply: str) -> PagedMockModel:
    ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    marker = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)

    def script(history):
        start = max(i for i in range(len(history) - len(marker) + 1) if history[i : i + len(marker)] == marker)
        return ids[min(len(history) - start - len(marker), len(ids) - 1)]

    return PagedMockModel(vocab_size=tokenizer.vocab_size, max_position_embeddings=1024,
                          eos_token_id=tokenizer.eos_token_id, script=script)


def ask(url, **request):
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    return client.chat.completions.create(model="tiny-chat", messages=QUESTION, max_tokens=200, **request)


def streamed(url, **request):
    """(content, tool calls as (name, arguments), finish reason) gathered from a stream."""
    content, calls, finish = "", {}, None
    for chunk in ask(url, stream=True, **request):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            calls[call.index] = (call.function.name, json.loads(call.function.arguments))
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("prefix", ["", "Let me check.\n"])
def test_tool_calls_come_back_as_openai_tool_calls(prefix, scripted_llm, openai_server):
    with openai_server(scripted_llm(prefix + CALL)) as url:
        response = ask(url, tools=TOOLS)
        streamed_reply = streamed(url, tools=TOOLS)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == (prefix.rstrip() or None)
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert streamed_reply == (prefix.rstrip(), [("get_weather", {"city": "Paris"})], "tool_calls")


@pytest.mark.parametrize("reply, request_fields", [
    (CALL, {"tools": TOOLS, "tool_choice": "none"}),
    (CALL, {}),  # no tools in the request
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>', {"tools": TOOLS}),
])
def test_text_that_is_no_call_stays_content(reply, request_fields, scripted_llm, openai_server):
    with openai_server(scripted_llm(reply)) as url:
        response = ask(url, **request_fields)
        assert streamed(url, **request_fields) == (reply, [], "stop")
    assert response.choices[0].message.content == reply
    assert response.choices[0].message.tool_calls is None
    assert response.choices[0].finish_reason == "stop"


def test_a_conversation_with_earlier_calls_renders_them(scripted_llm, openai_server):
    """OpenAI sends a call's arguments as a JSON string; the template writes them as the object."""
    llm = scripted_llm("It is sunny.")
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    templated = [*QUESTION, {"role": "assistant", "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, messages[2]]
    expected = llm.tokenizer.apply_chat_template(templated, add_generation_prompt=True, tools=TOOLS)
    assert CALL in llm.tokenizer.decode(expected)
    with openai_server(llm) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        response = client.chat.completions.create(model="tiny-chat", messages=messages, tools=TOOLS)
    assert response.usage.prompt_tokens == len(expected)
    assert response.choices[0].message.content == "It is sunny."
