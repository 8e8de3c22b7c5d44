"""Slow and idle clients cannot hold the gateway: a connection that does not finish its
request headers in `gateway.header_timeout` is closed (slowloris), whatever it sent (nothing, a
byte, the HTTP/2 preface), a kept-alive one after `gateway.idle_timeout` without a request, at
most `gateway.max_connections_per_ip` stay open per client address, and at most
`gateway.max_connections` in all, so idle ones cannot pile up. (A client that stops
reading a stream is covered by the router test a_client_that_stops_reading_a_stream_frees_its_draft_worker.)"""
import socket
import time
import urllib.parse

import httpx
import pytest

from conftest import policy_text


def connect(url, source="127.0.0.1"):
    u = urllib.parse.urlparse(url)
    return socket.create_connection((u.hostname, u.port), timeout=10, source_address=(source, 0))


def closed_within(s, limit):
    """Seconds until the server closed `s` (end of stream or reset), or None if still open."""
    s.settimeout(limit)
    started = time.time()
    try:
        while s.recv(4096):
            pass
    except socket.timeout:
        return None
    except ConnectionError:
        pass
    return time.time() - started


def test_quiet_connections_are_closed_whatever_they_sent(start_gateway):
    g = start_gateway(policy_text().replace("[gateway]", '[gateway]\nheader_timeout = "1s"', 1))
    openings = {
        "nothing": b"",
        "one byte": b"P",
        "the HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "the HTTP/2 preface and settings": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    }
    held = {}
    for what, data in openings.items():
        s = connect(g.url)
        s.sendall(data)
        held[what] = s
    for what, s in held.items():
        after = closed_within(s, 8)
        assert after is not None, f"{what}: still open after 8 s"
        s.close()
    assert httpx.get(g.url + "/health").status_code == 200


def test_an_idle_kept_alive_connection_is_closed(start_gateway):
    g = start_gateway(policy_text().replace("[gateway]", '[gateway]\nidle_timeout = "1s"', 1))
    s = connect(g.url)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    assert closed_within(s, 8) is not None
    s.close()


def test_a_normal_client_is_served_while_hundreds_of_idle_connections_are_held(start_gateway):
    # One address holds hundreds of idle connections (more than its cap); another is served.
    g = start_gateway(policy_text().replace("[gateway]", '[gateway]\nheader_timeout = "60s"\nmax_connections_per_ip = 100', 1))
    held = [connect(g.url, source="127.0.0.2") for _ in range(300)]
    time.sleep(0.5)
    open_ones = [s for s in held if closed_within(s, 0.05) is None]
    assert len(open_ones) == 100, len(open_ones)
    started = time.time()
    assert httpx.get(g.url + "/health", timeout=10).status_code == 200
    assert time.time() - started < 5
    for s in held:
        s.close()


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
