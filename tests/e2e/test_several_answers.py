"""`n` > 1 in approximate mode: `n` draft runs against the real draft and the real
llama-server, each on its own draft stream, seeded apart, each verified; usage sums them."""
import json

from conftest import MODEL, approxy_usage

ASK = [{"role": "user", "content": "Name a colour of the rainbow."}]


def test_n_answers_are_n_approximate_runs_with_usage_summed(gateway):
    client = gateway.client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, n=2, max_tokens=12, temperature=0.9, seed=11,
        extra_headers={"x-approxy-threshold": "0.5"})
    assert raw.headers["x-approxy-mode"] == "approximate"
    completion = raw.parse()
    assert [c.index for c in completion.choices] == [0, 1]
    assert all(c.message.content for c in completion.choices), completion.choices
    u = approxy_usage(raw)
    assert u["draft_tokens"] + u["target_tokens"] == completion.usage.completion_tokens, u
    # The same request with the same seed gives the same answers: each run is seeded (seed + i).
    again = client.chat.completions.create(
        model=MODEL, messages=ASK, n=2, max_tokens=12, temperature=0.9, seed=11,
        extra_headers={"x-approxy-threshold": "0"})
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, n=1, max_tokens=12, temperature=0.9, seed=11,
        extra_headers={"x-approxy-threshold": "0"})
    # At threshold 0 the draft writes everything: answer 0 is the n = 1 answer to the same seed.
    assert again.choices[0].message.content == first.choices[0].message.content


def test_streamed_n_answers_come_apart_by_index(gateway):
    client = gateway.client()
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, n=3, max_tokens=10, temperature=0.9, seed=5, stream=True,
        stream_options={"include_usage": True}, extra_headers={"x-approxy-threshold": "0.5"})
    texts, finishes, usage = ["", "", ""], [None, None, None], None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finishes[c.index] = c.finish_reason or finishes[c.index]
        usage = chunk.usage or usage
    assert all(texts) and all(f in ("stop", "length") for f in finishes), (texts, finishes)
    assert usage.model_extra["approxy"]["mode"] == "approximate"
    assert usage.completion_tokens >= 3
