"""Tool calls in approximate mode: tools are rendered by the model's chat template
(Qwen2.5's `<tools>` block) and a call is written under a grammar (the tool names, each tool's
parameters as its schema), against the real draft and the real llama-server. The answer is an
OpenAI `tool_calls` message; streamed, the SDK reassembles it from the deltas."""
import json

import jsonschema
import pytest

from conftest import MODEL, approxy_usage, raw_post

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "What's the weather in Oslo right now?"}]


def assert_valid_calls(calls):
    assert calls, "no tool call"
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_"), c
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("threshold", ["0", "0.9"])
def test_a_required_call_is_an_openai_tool_call_with_valid_arguments(gateway, threshold):
    client = gateway.client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
        parallel_tool_calls=False, max_tokens=80, temperature=0,
        extra_headers={"x-approxy-threshold": threshold})
    assert raw.headers["x-approxy-mode"] == "approximate"
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None, choice.message
    assert len(choice.message.tool_calls) == 1, choice.message
    assert_valid_calls(choice.message.tool_calls)
    u = approxy_usage(raw)
    # The call's frame and the tool's name are the grammar's.
    assert u["forced_tokens"] >= 8, u
    if threshold == "0":
        assert u["target_calls"] == 0, u


def test_a_named_tool_is_the_one_called(gateway):
    client = gateway.client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=60, temperature=0, extra_headers={"x-approxy-threshold": "0.9"})
    assert raw.headers["x-approxy-mode"] == "approximate"
    choice = raw.parse().choices[0]
    assert [c.function.name for c in choice.message.tool_calls] == ["get_time"], choice.message
    assert_valid_calls(choice.message.tool_calls)


def test_a_streamed_tool_call_is_reassembled_by_the_sdk(gateway):
    client = gateway.client()
    with client.chat.completions.stream(
            model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
            parallel_tool_calls=False, max_tokens=80, temperature=0,
            extra_headers={"x-approxy-threshold": "0.9"}) as stream:
        names = [ev.name for ev in stream if ev.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert names == ["get_weather"], names
    assert_valid_calls(choice.message.tool_calls)


def test_streamed_deltas_carry_the_name_first_then_the_arguments_in_pieces(gateway):
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
            "parallel_tool_calls": False, "max_tokens": 80, "temperature": 0, "stream": True}
    r = raw_post(gateway.url, "/v1/chat/completions", body)
    assert r.headers["x-approxy-mode"] == "approximate"
    deltas = [json.loads(line[6:])["choices"] for line in r.text.splitlines()
              if line.startswith("data: {")]
    calls = [c[0]["delta"]["tool_calls"][0] for c in deltas if c and c[0]["delta"].get("tool_calls")]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"].startswith("call_"), calls[0]
    assert all("name" not in c["function"] for c in calls[1:]), calls
    assert len(calls) > 2, "the arguments came in one piece"
    json.loads("".join(c["function"]["arguments"] for c in calls))
    assert deltas[-1][0]["finish_reason"] == "tool_calls", deltas[-1]


def test_a_tool_result_turn_is_answered_approximately(gateway):
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 4, \"sky\": \"rain\"}"}]
    client = gateway.client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=60,
        temperature=0, extra_headers={"x-approxy-threshold": "0.9"})
    assert raw.headers["x-approxy-mode"] == "approximate"
    choice = raw.parse().choices[0]
    # `none`: text only, never a call.
    assert choice.message.tool_calls is None and choice.message.content, choice.message
    assert choice.finish_reason in ("stop", "length"), choice
    # The tool's result reached the model through the template.
    assert approxy_usage(raw)["forced_tokens"] == 0
    assert raw.parse().usage.prompt_tokens > 100


def test_what_approxy_does_not_answer_passes_through_with_its_reason(gateway):
    for extra in [{"functions": [{"name": "get_weather", "parameters": {"type": "object"}}]},
                  {"tools": [WEATHER], "response_format": {"type": "json_object"}}]:
        body = {"model": MODEL, "messages": ASK, "max_tokens": 8, **extra}
        r = raw_post(gateway.url, "/v1/chat/completions", body)
        assert r.headers.get("x-approxy-mode") == "passthrough", (r.status_code, r.text)
        assert r.headers["x-approxy-passthrough-reason"] == "tools", extra


def test_langchain_bind_tools(gateway):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "rain"

    llm = ChatOpenAI(model=MODEL, base_url=gateway.base_url, api_key="unused", temperature=0,
                     max_tokens=80, max_retries=0, default_headers={"x-approxy-threshold": "0.9"})
    msg = llm.bind_tools([get_weather], tool_choice="any", parallel_tool_calls=False).invoke(
        "What's the weather in Oslo right now?")
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"], msg
    assert isinstance(msg.tool_calls[0]["args"].get("city"), str), msg.tool_calls
    assert msg.response_metadata["finish_reason"] == "tool_calls", msg.response_metadata
