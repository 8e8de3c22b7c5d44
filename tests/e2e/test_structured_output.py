"""Structured output in approximate mode: JSON Schema from the openai SDK's
`chat.completions.parse` and LangChain's `with_structured_output`, JSON mode and
`response_format: text` are answered by approxy under a grammar (llguidance over the draft's
vocabulary), against the real draft and the real llama-server. Every answer that ends is valid
for its schema; what the grammar forces costs no verifier and no target call."""
import json

import jsonschema
import pydantic
import pytest

from conftest import MODEL, approxy_usage, raw_post, read_stream

TEXT = ("Alice Martin is 31 years old, works as a nurse and lives in Lyon. "
        "Her brother Paul, 27, is a baker in Paris.")


class Person(pydantic.BaseModel):
    name: str
    age: int
    city: str


class People(pydantic.BaseModel):
    people: list[Person]


def ask(text):
    return [{"role": "system", "content": "Extract the requested data as JSON."},
            {"role": "user", "content": text}]


@pytest.mark.parametrize("threshold", ["0", "0.9"])
def test_the_openai_sdks_parse_gets_a_valid_approximate_answer(gateway, threshold):
    client = gateway.client()
    raw = client.chat.completions.with_raw_response.parse(
        model=MODEL, messages=ask(TEXT), response_format=People, max_tokens=200, temperature=0,
        extra_headers={"x-approxy-threshold": threshold})
    assert raw.headers["x-approxy-mode"] == "approximate"
    completion = raw.parse()
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    people = choice.message.parsed
    assert isinstance(people, People) and people.people, choice.message.content
    u = approxy_usage(raw)
    assert u["forced_tokens"] > 0, u
    assert u["draft_tokens"] + u["target_tokens"] == completion.usage.completion_tokens, u
    if threshold == "0":
        assert u["target_calls"] == 0, u


def test_a_streamed_schema_answer_is_valid_and_every_token_is_accounted_for(gateway):
    schema = Person.model_json_schema()
    schema["additionalProperties"] = False
    client = gateway.client()
    stream = client.chat.completions.create(
        model=MODEL, messages=ask("Alice Martin is 31 and lives in Lyon."), max_tokens=100,
        temperature=0, stream=True, stream_options={"include_usage": True},
        response_format={"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": schema}},
        extra_headers={"x-approxy-threshold": "0.9"})
    text, finish, usage = read_stream(stream)
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), schema)
    u = usage.model_extra["approxy"]
    assert u["mode"] == "approximate" and u["forced_tokens"] > 0, u


def test_json_mode_and_text_are_answered_approximately(gateway):
    client = gateway.client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ask("List two colours as a JSON object with a key 'colours'."),
        max_tokens=60, temperature=0, response_format={"type": "json_object"})
    assert raw.headers["x-approxy-mode"] == "approximate"
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "stop", choice
    # Any object: its keys are free, so little is forced (with Qwen's tokens, `{` itself can
    # merge with what follows); what counts is that the answer is one.
    assert isinstance(json.loads(choice.message.content), dict), choice.message.content
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
        temperature=0, response_format={"type": "text"})
    assert raw.headers["x-approxy-mode"] == "approximate"
    assert approxy_usage(raw)["forced_tokens"] == 0


def test_a_schema_the_grammar_engine_refuses_passes_through_with_its_reason(gateway):
    # What Pydantic writes for a `set[str]`: llguidance does not implement `uniqueItems` (and
    # llama-server ignores it), so approxy could not keep the answer to the schema.
    tags = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    body = {"model": MODEL, "messages": ask("Tag: red, blue."), "max_tokens": 16,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object", "properties": {"tags": tags}, "required": ["tags"]}}}}
    r = raw_post(gateway.url, "/v1/chat/completions", body)
    assert r.headers.get("x-approxy-mode") == "passthrough", (r.status_code, r.text)
    assert r.headers["x-approxy-passthrough-reason"] == "schema_unsupported"
    assert r.status_code == 200, r.text


def test_langchain_with_structured_output(gateway):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=gateway.base_url, api_key="unused", temperature=0,
                     max_tokens=120, max_retries=0,
                     default_headers={"x-approxy-threshold": "0.9"})
    person = llm.with_structured_output(Person, method="json_schema").invoke(
        ask("Alice Martin is 31 and lives in Lyon."))
    assert isinstance(person, Person), person
    assert person.age > 0 and person.name, person
