"""Slow and idle clients cannot hold the gateway: a connection that does not finish its
request headers in `gateway.header_timeout` is closed (slowloris), and at most
`gateway.max_connections` are open at once, so idle ones cannot pile up. (A client that stops
reading a stream is covered by the router test a_client_that_stops_reading_a_stream_frees_its_draft_worker.)"""
import socket
import time
import urllib.parse

import httpx
import pytest

from conftest import policy_text


def connect(url):
    u = urllib.parse.urlparse(url)
    return socket.create_connection((u.hostname, u.port), timeout=10)


def test_unfinished_headers_are_cut_off(start_gateway):
    g = start_gateway(policy_text().replace("[gateway]", '[gateway]\nheader_timeout = "1s"', 1))
    s = connect(g.url)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    started = time.time()
    data = s.recv(1024)  # the server closes (possibly after a 408)
    assert data == b"" or data.startswith(b"HTTP/1.1 408"), data
    assert time.time() - started < 8
    s.close()
    assert httpx.get(g.url + "/health").status_code == 200


def test_connections_are_capped(start_gateway):
    g = start_gateway(policy_text().replace("[gateway]", '[gateway]\nmax_connections = 2\nheader_timeout = "30s"', 1))
    idle = [connect(g.url), connect(g.url)]
    time.sleep(0.3)
    # Both slots are held by idle connections: a third client is not served.
    with pytest.raises(httpx.TimeoutException):
        httpx.get(g.url + "/health", timeout=1.5)
    idle.pop().close()
    assert httpx.get(g.url + "/health", timeout=10).status_code == 200
    for s in idle:
        s.close()


def test_sigterm_finishes_the_requests_in_flight(start_gateway):
    import signal

    from conftest import MODEL
    g = start_gateway()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count from 1 to 30."}], "max_tokens": 60, "stream": True}
    with httpx.stream("POST", g.url + "/v1/chat/completions", json=body, headers={"x-approxy-threshold": "0"}, timeout=120) as r:
        lines = r.iter_lines()
        first = next(lines)
        assert first.startswith("data: ")
        g.proc.send_signal(signal.SIGTERM)
        rest = list(lines)
    assert any(line == "data: [DONE]" for line in rest), rest[-3:]
    assert g.proc.wait(timeout=30) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(g.url + "/health", timeout=5)
