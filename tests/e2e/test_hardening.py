"""Hardening against the real llama-server target: client mistakes that
llama-server answers with a 500 are the client's 400 and never count against the target; a
prompt of megabytes that cannot fit is refused at once, without the gateway's memory growing
with it; completion prompt arrays share `n`'s bound; protocol refusals are in the OpenAI shape;
a passthrough stream the client leaves is counted as left."""
import json
import socket
import time
import urllib.parse

import httpx
import pytest

from conftest import MODEL, TARGET_KIND
from test_disconnects import metric
from test_errors import shape

MSG = [{"role": "user", "content": "Say hi."}]


def rss_mib(g):
    with open(f"/proc/{g.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def target_errors(g):
    text = httpx.get(g.url + "/metrics", timeout=10).text
    return sum(float(l.split()[-1]) for l in text.splitlines()
               if l.startswith("approxy_errors_total") and 'side="target"' in l)


@pytest.mark.skipif(TARGET_KIND != "llama_cpp", reason="llama-server's 500s for these shapes")
def test_client_mistakes_llama_server_answers_with_a_500_are_the_clients_400(gateway):
    # The probe's five (each was a 502 `target_unavailable`, counted against the target).
    assistant = lambda args: [*MSG, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]}]
    before = target_errors(gateway)
    for extra, param in [
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": "x"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]},
         "messages"),
        ({"messages": assistant("{not json")}, "messages[1].tool_calls[0].function.arguments"),
    ]:
        body = {"model": MODEL, "messages": MSG, "max_tokens": 4, **extra}
        shape(httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=60), 400, param)
    assert target_errors(gateway) == before


def test_a_prompt_of_megabytes_that_cannot_fit_is_refused_at_once_and_memory_stays_flat(gateway):
    # The test llama-server holds 4,096 positions per slot; 4 MiB of "ab " cannot fit in them,
    # which its length alone says (it used to be tokenized whole, twice: 400 MB a request).
    big = {"model": MODEL, "messages": [{"role": "user", "content": "ab " * 1398000}], "max_tokens": 4}
    start = rss_mib(gateway)
    for _ in range(3):
        began = time.time()
        err = shape(httpx.post(gateway.url + "/v1/chat/completions", json=big, timeout=60), 400, "messages")
        assert time.time() - began < 3, "refused only after work"
        assert "context" in err["message"]
    # A completions prompt alike.
    shape(httpx.post(gateway.url + "/v1/completions", json={"model": MODEL, "prompt": "ab " * 1398000, "max_tokens": 4},
                     timeout=60), 400, "prompt")
    assert rss_mib(gateway) < start + 100, f"{start:.0f} MiB before, {rss_mib(gateway):.0f} after"


def test_completion_prompts_times_n_share_ns_bound(gateway):
    prompts = [f"{i} +" for i in range(100)]
    err = shape(httpx.post(gateway.url + "/v1/completions", json={"model": MODEL, "prompt": prompts, "max_tokens": 2},
                           timeout=60), 400, "prompt")
    assert "max_n" in err["message"]
    shape(httpx.post(gateway.url + "/v1/completions", json={"model": MODEL, "prompt": ["a", "b", "c"], "n": 6, "max_tokens": 2},
                     timeout=60), 400, "prompt")


def raw_request(url, head):
    """Sends a raw HTTP/1.1 request head and returns the status, the headers and the body."""
    u = urllib.parse.urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(head)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    return status, headers, body


def test_protocol_refusals_are_in_the_openai_shape_with_a_request_id(gateway):
    flood = "".join(f"x-flood-{i}: 1\r\n" for i in range(150))
    for head, status, code in [
        (f"GET /v1/models?q={'a' * 10000} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", 414, "uri_too_long"),
        (f"GET /v1/models HTTP/1.1\r\nhost: x\r\n{flood}connection: close\r\n\r\n", 431, "headers_too_large"),
    ]:
        got, headers, body = raw_request(gateway.url, head.encode())
        assert got == status, body
        assert "x-request-id" in headers
        assert json.loads(body)["error"]["code"] == code
    for method, path in [("DELETE", "/v1/models"), ("PUT", "/v1/models"), ("GET", "/v1/chat/completions")]:
        r = httpx.request(method, gateway.url + path, timeout=10)
        shape(r, 405)
        assert r.headers["allow"]


@pytest.mark.skipif(TARGET_KIND != "llama_cpp", reason="one passthrough stream is enough")
def test_a_passthrough_stream_the_client_leaves_is_counted_as_left(gateway):
    label = 'mode="passthrough",outcome="client_gone"'
    before = metric(gateway, "approxy_requests_total", label)
    # `logit_bias` is passed through (approxy does not support it).
    # Greedy: a sampled answer can end before the client leaves.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count from 1 to 200."}], "max_tokens": 300,
            "stream": True, "logit_bias": {"15": -1}, "temperature": 0}
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.headers["x-approxy-mode"] == "passthrough"
        for i, _ in enumerate(r.iter_lines()):
            if i > 4:
                break
    deadline = time.time() + 10
    while metric(gateway, "approxy_requests_total", label) == before and time.time() < deadline:
        time.sleep(0.2)
    assert metric(gateway, "approxy_requests_total", label) == before + 1
