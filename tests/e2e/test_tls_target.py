"""An https:// target with a private CA: engine calls, passthrough (streaming and not) and
/ready all go through TLS, and a target whose certificate the gateway does not trust is
refused with a clear error.

The TLS side is real: a TLS-terminating front (Python's ssl module, a test CA made by trustme
in the test) forwards the bytes unchanged to the real llama-server target."""
import json
import select
import socket
import ssl
import threading
import urllib.parse

import httpx
import pytest
import trustme

from conftest import MODEL, TARGET, policy_text

MSG = [{"role": "user", "content": "What is 2+2? Answer with the number only."}]


class TlsFront:
    """Accepts TLS on 127.0.0.1 with a certificate for `localhost` issued by `ca`, and pipes
    each connection's plaintext to the real target."""

    def __init__(self, ca: trustme.CA):
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("localhost", "127.0.0.1").configure_cert(self.ctx)
        # The bytes go to llama-server unchanged, which speaks HTTP/1.1 only.
        self.ctx.set_alpn_protocols(["http/1.1"])
        up = urllib.parse.urlsplit(TARGET)
        self.upstream = (up.hostname, up.port)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handshakes_failed = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return f"https://localhost:{self.port}"

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            self.handshakes_failed += 1
            conn.close()
            return
        up = socket.create_connection(self.upstream)
        try:
            while True:
                ready, _, _ = select.select([tls, up], [], [], 300)
                if not ready:
                    return
                for src in ready:
                    dst = up if src is tls else tls
                    data = src.recv(65536)
                    if not data:
                        return
                    dst.sendall(data)
                # Bytes ssl has already decrypted do not wake select(): drain them too.
                while tls.pending():
                    up.sendall(tls.recv(65536))
        except OSError:
            return
        finally:
            up.close()
            tls.close()

    def close(self):
        self.closed = True
        self.sock.close()


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture(scope="module")
def front(ca):
    f = TlsFront(ca)
    yield f
    f.close()


def with_ca_file(text, ca_file):
    """Policy text with `target.ca_file` set."""
    return text.replace('backoff = "200ms"', f'backoff = "200ms"\nca_file = "{ca_file}"')


def tls_policy(tmp_path, front, ca_pem_source, **over):
    ca_file = tmp_path / "target-ca.pem"
    ca_pem_source.cert_pem.write_to_path(str(ca_file))
    return with_ca_file(policy_text(base_url=front.url, **over), ca_file)


def test_https_target_ready_engine_and_passthrough(start_gateway, front, ca, tmp_path):
    g = start_gateway(tls_policy(tmp_path, front, ca))
    ready = httpx.get(g.url + "/ready", timeout=30)
    assert ready.status_code == 200, ready.text
    assert ready.json()["target_reachable"] is True

    # Engine calls: at threshold 1 every token is the target's, fetched over TLS.
    c = g.client()
    raw = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=MSG, max_tokens=8, temperature=0, extra_headers={"x-approxy-threshold": "1"})
    assert raw.headers["x-approxy-mode"] == "approximate"
    usage = json.loads(raw.http_response.text)["usage"]["approxy"]
    assert usage["target_calls"] > 0 and usage["target_tokens"] > 0, usage
    assert "4" in raw.parse().choices[0].message.content

    # Passthrough, whole answer: logprobs are not served by the engine.
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=8, logprobs=True)
    assert raw.headers["x-approxy-passthrough-reason"] == "logprobs"
    assert raw.parse().choices[0].message.content

    # Passthrough, streamed.
    with httpx.stream("POST", g.url + "/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": MSG, "max_tokens": 8, "stream": True, "logprobs": True}) as r:
        assert r.status_code == 200
        assert r.headers["x-approxy-mode"] == "passthrough"
        lines = [l for l in r.iter_lines() if l.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 2


def test_untrusted_target_certificate_is_refused_clearly(start_gateway, front, tmp_path):
    before = front.handshakes_failed
    g = start_gateway(tls_policy(tmp_path, front, trustme.CA()))  # a CA that did not sign it
    ready = httpx.get(g.url + "/ready", timeout=30)
    assert ready.status_code == 503
    assert "certificate" in ready.json()["target_error"].lower(), ready.json()

    for body in ({"model": MODEL, "messages": MSG, "max_tokens": 8},  # engine path
                 {"model": MODEL, "messages": MSG, "max_tokens": 8, "logprobs": True}):  # passthrough
        r = httpx.post(g.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert err["code"] == "target_tls_error", err
        assert "TLS" in err["message"]
    assert front.handshakes_failed > before
    assert "invalid peer certificate" in g.logs()


def test_ca_file_that_is_not_pem_fails_the_policy_check(tmp_path):
    import subprocess
    from conftest import BIN
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    policy = tmp_path / "p.toml"
    policy.write_text(with_ca_file(policy_text(base_url="https://localhost:1"), bad))
    out = subprocess.run([BIN, "check", "--policy", str(policy)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "target.ca_file" in out.stderr


def test_unservable_scheme_is_refused_at_start(tmp_path):
    import subprocess
    from conftest import BIN
    policy = tmp_path / "p.toml"
    policy.write_text(policy_text(base_url="ftp://127.0.0.1:1"))
    out = subprocess.run([BIN, "check", "--policy", str(policy)], capture_output=True, text=True)
    assert out.returncode != 0
    assert 'scheme "ftp" cannot be served' in out.stderr
