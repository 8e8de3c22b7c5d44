"""Secrets canary: the client key and the target key, set to unique values, must not appear in
any log line (at trace level), any response body or header, /metrics, /ready or /health, across
approximate answers, streams, passthrough, errors and refused routes."""
import httpx

from conftest import MODEL, approxy_usage, policy_text, raw_post

CLIENT_KEY = "sk-client-canary-7f3a9c1e"
TARGET_KEY = "sk-target-canary-91bd2e4f"
MSG = [{"role": "user", "content": "Say hi."}]


def test_keys_never_leave_the_gateway(start_gateway):
    text = policy_text().replace('auth = "none"', 'api_keys_env = "APPROXY_API_KEYS"')
    g = start_gateway(text, env={"APPROXY_API_KEYS": CLIENT_KEY, "APPROXY_TARGET_API_KEY": TARGET_KEY, "RUST_LOG": "trace"})
    auth = {"authorization": f"Bearer {CLIENT_KEY}"}
    seen = []

    def keep(r):
        seen.append(r.text)
        seen.append(repr(dict(r.headers)))
        return r

    c = g.client(api_key=CLIENT_KEY)
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=8, temperature=0)
    assert approxy_usage(raw)["mode"] == "approximate"
    keep(raw.http_response)
    with httpx.stream("POST", g.url + "/v1/chat/completions", headers=auth, timeout=120,
                      json={"model": MODEL, "messages": MSG, "max_tokens": 8, "stream": True}) as s:
        s.read()
        keep(s)
    # Passthrough (logprobs), a refused route, a wrong key, bad JSON, a bad threshold.
    keep(raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG, "max_tokens": 4, "logprobs": True}, headers=auth))
    keep(httpx.get(g.url + "/v1/files", headers=auth))
    keep(raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG}, headers={"authorization": "Bearer nope"}))
    keep(raw_post(g.url, "/v1/chat/completions", content=b"{not json", headers=auth))
    keep(raw_post(g.url, "/v1/chat/completions", {"model": MODEL, "messages": MSG}, headers={**auth, "x-approxy-threshold": "7"}))
    keep(httpx.get(g.url + "/v1/models", headers=auth))
    for path in ["/metrics", "/ready", "/health"]:
        keep(httpx.get(g.url + path, headers=auth))
    logs = g.logs()
    assert "trace" in logs.lower(), "the gateway logged at trace level"
    for key in [CLIENT_KEY, TARGET_KEY]:
        for i, text in enumerate(seen):
            assert key not in text, f"key in response {i}: {text[:300]}"
        assert key not in logs, "key in the gateway's log"
