"""Every error row: OpenAI error shape, right status, nothing leaked."""
import threading
import time

import openai
import pytest

from conftest import MODEL, policy_text, raw_post

MSG = [{"role": "user", "content": "Say hi."}]


def shape(resp, status, param=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param:
        assert err["param"] == param
    return err


def test_malformed_json_and_bad_params(gateway):
    shape(raw_post(gateway.url, "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}), 400)
    shape(raw_post(gateway.url, "/v1/chat/completions", {"model": MODEL}), 400, "messages")
    shape(raw_post(gateway.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "temperature": 9}), 400, "temperature")
    shape(raw_post(gateway.url, "/v1/completions", {"model": MODEL, "prompt": 42}), 400, "prompt")
    shape(raw_post(gateway.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": -1}), 400, "max_tokens")
    with pytest.raises(openai.BadRequestError) as e:
        gateway.client().chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}])
    assert "role" in str(e.value)


def test_threshold_header_out_of_range(start_gateway):
    g = start_gateway(policy_text(threshold_override="[0.5, 0.9]"))
    err = shape(raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 4},
                         headers={"x-approxy-threshold": "0.2"}), 400, "x-approxy-threshold")
    assert "[0.5, 0.9]" in err["message"]
    shape(raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG}, headers={"x-approxy-threshold": "lots"}), 400)


def test_a_prompt_longer_than_the_targets_context_is_refused_at_once(gateway):
    # The test llama-server holds 4,096 positions per slot (its /props says so); this prompt
    # is about 5,000 tokens. The 400 comes before any draft work: no prefill of it first.
    long = [{"role": "user", "content": "apple " * 5000}]
    started = time.time()
    err = shape(raw_post(gateway.url, "/v1/chat/completions", {"model": MODEL, "messages": long, "max_tokens": 8}), 400, "messages")
    assert "context" in err["message"]
    assert time.time() - started < 5


def test_an_image_to_a_text_model_is_the_clients_400(gateway):
    # llama-server says in /props that it takes no images (it would answer one with a 500).
    msg = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    err = shape(raw_post(gateway.url, "/v1/chat/completions", {"model": MODEL, "messages": msg, "max_tokens": 8}), 400, "messages")
    assert "image" in err["message"]


def test_tools_of_the_wrong_shape_are_the_clients_400(gateway):
    shape(raw_post(gateway.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "tools": "x"}), 400, "tools")


def test_body_over_limit(gateway):
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (5 << 20)}]}
    shape(raw_post(gateway.url, "/v1/chat/completions", big), 413)


def test_auth(start_gateway):
    g = start_gateway(policy_text().replace('auth = "none"', 'api_keys_env = "APPROXY_API_KEYS"'), env={"APPROXY_API_KEYS": "k-one, k-two"})
    shape(raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG}), 401)
    shape(raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG}, headers={"authorization": "Bearer nope"}), 401)
    with pytest.raises(openai.AuthenticationError):
        g.client(api_key="wrong").models.list()
    r = g.client(api_key="k-two").chat.completions.create(model=MODEL, messages=MSG, max_tokens=4)
    assert r.choices[0].message.content is not None


def test_overload_sheds_with_retry_after(start_gateway, fault_proxy):
    # The one slot is held by a request whose target call the proxy holds for a few seconds: a
    # draft-only stream, as this test once used, can finish before the second request arrives.
    p = fault_proxy(fail_after=0, mode="slow", delay=4)
    g = start_gateway(policy_text(base_url=p.url, max_concurrent_requests="1"))
    held = {}
    first = threading.Thread(target=lambda: held.update(r=raw_post(
        g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 4},
        headers={"x-approxy-threshold": "1"})))
    first.start()
    for _ in range(200):
        if p.completions:
            break
        time.sleep(0.02)
    assert p.completions, "the first request never reached the target"
    r = raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 4})
    shape(r, 429)
    assert r.headers["retry-after"] == "1"
    first.join()
    assert held["r"].status_code == 200, held["r"].text


def test_target_unreachable_is_502(start_gateway):
    g = start_gateway(policy_text(base_url="http://127.0.0.1:9", retries="1", backoff='"10ms"'))
    err = shape(raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 4}), 502)
    assert "127.0.0.1" not in err["message"]
    shape(raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]}), 502)


def test_target_timeout_is_504(start_gateway, fault_proxy):
    p = fault_proxy(fail_after=0, mode="slow", delay=5)
    g = start_gateway(policy_text(base_url=p.url, timeout='"1s"', retries="0"))
    shape(raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 4},
                   headers={"x-approxy-threshold": "1"}), 504)


def test_target_5xx_after_retries_is_502_without_leaking(start_gateway, fault_proxy):
    p = fault_proxy(fail_after=0)
    g = start_gateway(policy_text(base_url=p.url, retries="2", backoff='"10ms"'))
    r = raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 4}, headers={"x-approxy-threshold": "1"})
    shape(r, 502)
    assert "secret" not in r.text
    assert p.completions == 3, "one try plus two retries"


def test_failure_mid_stream_is_error_event_then_close(start_gateway, fault_proxy):
    p = fault_proxy(fail_after=3)
    # One-token corrections and no prices (no cost guard, which would hand the whole answer to
    # the target in one call): a call per token, so the injected failure comes mid-stream.
    # Greedy: at the API's default temperature (1) the target may sample "Hi!" and stop within
    # the three calls that succeed (CI at 0d2622b failed so).
    g = start_gateway(policy_text(base_url=p.url, retries="0", price="{ input = 0.0, cached_input = 0.0, output = 0.0 }",
                                  correction='{ mode = "fixed", tokens = 1 }'))
    raw = g.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=MSG, max_tokens=40, temperature=0, stream=True,
        extra_headers={"x-approxy-threshold": "1"})
    got, err = "", None
    try:
        for chunk in raw.parse():
            if chunk.choices:
                got += chunk.choices[0].delta.content or ""
    except openai.APIError as x:
        err = x
    # If the stream ends without an error, say why: a passthrough (its reason), or an answer
    # done in three calls.
    assert err is not None, (
        f"the stream ended without an error event: passthrough reason "
        f"{raw.headers.get('x-approxy-passthrough-reason')}, {p.completions} /completion calls, "
        f"answer {got!r}; gateway log:\n{g.logs()[-3000:]}")
    assert got, "tokens before the failure must arrive"
    assert "secret" not in str(err)
    # The gateway stays healthy afterwards.
    assert raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 2},
                    headers={"x-approxy-threshold": "0"}).status_code == 200


def test_environment_proxy_only_when_the_policy_says(start_gateway):
    """HTTP_PROXY pointing at nothing: ignored by default (the target key goes nowhere else),
    used (and so failing, 502) when the policy asks for it."""
    env = {"HTTP_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}
    ignored = start_gateway(env=env)
    r = ignored.client().chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=4, logprobs=True)
    assert r.headers["x-approxy-mode"] == "passthrough" and r.parse().choices[0].message.content is not None
    used = start_gateway(policy_text().replace("[gateway]", "use_env_proxy = true\n\n[gateway]", 1), env=env)
    shape(raw_post(used.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 4, "logprobs": True}), 502)
