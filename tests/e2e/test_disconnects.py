"""Clients that leave, at each phase of an approximate request, and policy reloads under load.

After every disconnect the gateway must be back to rest: every draft worker idle (its lease
returned, no prefill or step still running for nobody) and no llama-server slot still
generating for the abandoned request. Reloads (valid, invalid, one that would drop auth) land
while requests are in flight; none of those requests may fail."""
import threading
import time

import httpx
import pytest

from conftest import MODEL, TARGET, TARGET_KIND, policy_text

KEYS = {"APPROXY_API_KEYS": "k-soak"}
AUTH = {"authorization": "Bearer k-soak"}


def keyed_policy(**over):
    return policy_text(**over).replace('auth = "none"', 'api_keys_env = "APPROXY_API_KEYS"')


def at_rest(g, timeout=15.0):
    """Waits until every draft worker is idle and no target slot is processing; says what is not."""
    deadline = time.time() + timeout
    state = {}
    while time.time() < deadline:
        ready = httpx.get(g.url + "/ready", timeout=10).json()
        slots = httpx.get(TARGET + "/slots", timeout=10).json() if TARGET_KIND == "llama_cpp" else []
        busy = [s["id"] for s in slots if s.get("is_processing")]
        state = {"idle": ready["draft_workers_idle"], "workers": ready["draft_workers"], "target_slots_busy": busy,
                 "request_slots_free": ready["request_slots_free"]}
        if state["idle"] == state["workers"] and not busy:
            return state
        time.sleep(0.25)
    raise AssertionError(f"not at rest after {timeout} s: {state}")


def leave(g, body, threshold, after_lines=None, after_seconds=None):
    """Starts a streamed request and closes the connection after some SSE lines or some time."""
    headers = {**AUTH, "x-approxy-threshold": threshold}
    if after_seconds is not None:
        with pytest.raises(httpx.ReadTimeout):
            # Nothing arrives before the prompt is read: the read timeout is the client leaving.
            with httpx.stream("POST", g.url + "/v1/chat/completions", json=body, headers=headers,
                              timeout=httpx.Timeout(30, read=after_seconds)) as r:
                r.read()
        return
    with httpx.stream("POST", g.url + "/v1/chat/completions", json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read()
        seen = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append(line)
                if len(seen) >= after_lines:
                    break
        assert len(seen) >= after_lines, f"the answer ended before the client could leave: {seen}"


@pytest.mark.skipif(TARGET_KIND != "llama_cpp", reason="reads llama-server's /slots")
def test_a_client_leaving_at_any_phase_leaves_nothing_running(start_gateway):
    g = start_gateway(keyed_policy(), env=KEYS)
    assert at_rest(g)["workers"] == 1
    count = {"role": "user", "content": "Count from 1 to 200, one number per line."}
    # Greedy, so the answer is the long count every time: sampled at the default temperature, the
    # target once wrote an answer four SSE lines long, done before the client could leave.
    counting = {"model": MODEL, "messages": [count], "max_tokens": 300, "stream": True, "temperature": 0}
    # 1. During the draft's prefill of a long prompt (before any byte of the answer).
    long = {"role": "user", "content": "Summarise this text. " + "The quick brown fox jumps over the lazy dog. " * 250}
    leave(g, {"model": MODEL, "messages": [long], "max_tokens": 64, "stream": True}, "0.7", after_seconds=1.0)
    at_rest(g)
    # 2. While the draft writes alone (threshold 0: no target call at all).
    leave(g, counting, "0", after_lines=5)
    at_rest(g)
    # 3. While the target writes a span (threshold 1: every token is the target's).
    leave(g, counting, "1", after_lines=5)
    at_rest(g)
    # 4. Mixed, where calls start and stop often.
    leave(g, counting, "0.7", after_lines=12)
    at_rest(g)
    # And the gateway still answers, with its slots all free again.
    r = httpx.post(g.url + "/v1/chat/completions", headers=AUTH, timeout=120,
                   json={"model": MODEL, "messages": [count], "max_tokens": 8})
    assert r.status_code == 200
    assert at_rest(g)["request_slots_free"] == 64


def metric(g, name, label):
    text = httpx.get(g.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name) and label in line:
            return float(line.split()[-1])
    return 0.0


def test_policy_reloads_under_load_fail_no_request(start_gateway):
    g = start_gateway(keyed_policy(workers="2"), env=KEYS)
    stop = threading.Event()
    results = []

    def client(stream, threshold):
        while not stop.is_set():
            body = {"model": MODEL, "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 16, "stream": stream}
            headers = {**AUTH, "x-approxy-threshold": threshold}
            try:
                r = httpx.post(g.url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
                ok = r.status_code == 200 and (r.text.rstrip().endswith("data: [DONE]") if stream else "choices" in r.json())
                results.append((ok, r.status_code, r.text[-200:]))
            except httpx.HTTPError as e:
                results.append((False, None, repr(e)))

    threads = [threading.Thread(target=client, args=a) for a in [(True, "0.7"), (False, "0"), (True, "0"), (False, "0.7")]]
    for t in threads:
        t.start()
    try:
        changes = [
            keyed_policy(workers="2", threshold="0.5"),          # valid
            keyed_policy(workers="2", threshold="9"),            # invalid: rejected
            policy_text(workers="2", threshold="0.6"),            # drops auth: refused
            keyed_policy(workers="2", threshold="0.8"),          # valid
            keyed_policy(workers="2", mode='"passthrough"'),     # valid: everything passes through
            keyed_policy(workers="2"),                            # valid: back to approximate
        ]
        for text in changes:
            g.policy.write_text(text)
            time.sleep(3)  # the watcher looks once a second
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=180)
    failed = [r for r in results if not r[0]]
    assert len(results) >= 8, results
    assert not failed, failed[:3]
    assert metric(g, "approxy_policy_reloads_total", 'outcome="applied"') >= 4
    assert metric(g, "approxy_policy_reloads_total", 'outcome="rejected"') >= 2
    # Auth is still on.
    assert httpx.get(g.url + "/v1/models", timeout=10).status_code == 401
    at_rest(g)
