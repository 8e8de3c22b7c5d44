"""Requests the engine does not serve go to the target unchanged, and say why."""

import httpx

from conftest import MODEL, TARGET, policy_text, raw_post, with_kind

MSG = [{"role": "user", "content": "What is 2+2? Answer with the number only."}]


def test_ineligible_requests_pass_through(gateway):
    c = gateway.client()
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=8, logprobs=True, top_logprobs=2)
    assert raw.headers["x-approxy-mode"] == "passthrough"
    assert raw.headers["x-approxy-passthrough-reason"] == "logprobs"
    assert raw.parse().choices[0].logprobs is not None
    raw = c.completions.with_raw_response.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4, logprobs=1)
    assert raw.headers["x-approxy-passthrough-reason"] == "logprobs"


def test_passthrough_streams(gateway):
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": MSG, "max_tokens": 16, "stream": True, "logprobs": True}) as r:
        assert r.headers["x-approxy-mode"] == "passthrough"
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [l for l in r.iter_lines() if l.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 2


def test_policy_passthrough_mode(start_gateway):
    g = start_gateway(policy_text(mode='"passthrough"'))
    raw = g.client().chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=8, temperature=0)
    assert raw.headers["x-approxy-passthrough-reason"] == "policy_passthrough"
    assert "4" in raw.parse().choices[0].message.content


def test_target_that_cannot_continue_passes_everything_through(start_gateway):
    # llama-server's OpenAI chat API, declared as a chat-only target (as OpenAI's own chat models
    # are: they cannot continue a partial assistant answer).
    text = with_kind(policy_text(base_url=TARGET.rstrip("/") + "/v1"), "openai_chat")
    g = start_gateway(text)
    assert "target_cannot_continue" in g.logs()
    c = g.client()
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=8, temperature=0)
    assert raw.headers["x-approxy-mode"] == "passthrough"
    assert raw.headers["x-approxy-passthrough-reason"] == "target_cannot_continue"
    assert "4" in raw.parse().choices[0].message.content
    with httpx.stream("POST", g.url + "/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": MSG, "max_tokens": 8, "stream": True}) as r:
        assert r.headers["x-approxy-passthrough-reason"] == "target_cannot_continue"
        lines = [l for l in r.iter_lines() if l.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert httpx.get(g.url + "/ready", timeout=30).json()["target_reachable"] is True


def test_saturated_draft_degrades_to_passthrough(start_gateway):
    # One worker taking one stream: the second request finds no draft stream free.
    c = start_gateway(policy_text(workers="1", streams_per_worker="1")).client()
    # Hold the only draft stream with an open approximate stream...
    stream = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long story about a dragon."}], max_tokens=300,
        stream=True, extra_headers={"x-approxy-threshold": "0"})
    assert stream.headers["x-approxy-mode"] == "approximate"
    it = iter(stream.parse())
    next(it)
    # ...so the next request is served by the target directly instead of queueing.
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=8)
    assert raw.headers["x-approxy-mode"] == "passthrough"
    assert raw.headers["x-approxy-passthrough-reason"] == "draft_saturated"
    assert raw.parse().choices[0].message.content
    stream.parse().close()
