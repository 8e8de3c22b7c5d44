"""End-to-end fixtures: real `approxy serve` processes in front of the real llama-server target
started by deploy/test-all.sh (APPROXY_TEST_TARGET_URL), and a small fault-injecting proxy for
the failure tests (the one place a stand-in upstream is the point)."""
import http.server
import json
import os
import pathlib
import re
import subprocess
import threading
import time
import urllib.request

import httpx
import openai
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("APPROXY_BIN", str(REPO / "target" / "release" / "approxy"))
TARGET = os.environ.get("APPROXY_TEST_TARGET_URL")
MODEL = os.environ.get("APPROXY_TARGET_ALIAS", "qwen2.5-coder-1.5b-instruct")

# "llama_cpp" (the default), "vllm", "openai_text" or "chat_prefix": test-all.sh runs the client
# suite again with llama-server as an openai_text and a chat_prefix target (its prefill), with
# a real vLLM as the target, and with vLLM as a chat_prefix target (continue_final_message).
TARGET_KIND = os.environ.get("APPROXY_E2E_TARGET_KIND", "llama_cpp")
PREFIX_STYLE = os.environ.get("APPROXY_E2E_PREFIX_STYLE", "prefill")

if not TARGET:
    raise RuntimeError("APPROXY_TEST_TARGET_URL is not set: run ./deploy/test-all.sh (the README's test command)")


def with_kind(text, kind, extra=""):
    """A policy's text with its target's `kind` set (and `extra` lines after it), less the
    shipped policy's slots, which only a llama_cpp target takes (`target.cache.slots`)."""
    text = re.sub(r'^kind = .*$', f'kind = "{kind}"' + (f"\n{extra}" if extra else ""), text, count=1, flags=re.M)
    if kind != "llama_cpp":
        text = re.sub(r'^cache = \{ slots = true \}$', '', text, count=1, flags=re.M)
    return text


def policy_text(base_url=TARGET, **over):
    """policies/default.toml pointed at `base_url` (a server root) for the target kind under
    test, with `key = value` lines replaced."""
    text = (REPO / "policies" / "default.toml").read_text()
    if TARGET_KIND != "llama_cpp":
        style = f'prefix_style = "{PREFIX_STYLE}"' if TARGET_KIND == "chat_prefix" else ""
        text = with_kind(text, TARGET_KIND, style)
        base_url = base_url.rstrip("/") + "/v1"
    text = re.sub(r'^base_url = .*$', f'base_url = "{base_url}"', text, flags=re.M)
    # The tests drive the whole dial (0: draft only, 1: target only); the shipped policy stops
    # clients at 0.9.
    over.setdefault("threshold_override", "[0.0, 1.0]")
    for key, value in over.items():
        text, n = re.subn(rf'^{key} = .*$', f"{key} = {value}", text, flags=re.M)
        assert n == 1, f"no line for {key}"
    return text


def stop_process(proc, grace=30):
    """Stops a server as process supervisors do: SIGTERM, up to `grace` seconds, then SIGKILL;
    always reaped. Returns its exit status (negative: the signal that ended it)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Gateway:
    def __init__(self, tmp: pathlib.Path, text: str, env=None, policy_path=None):
        # policy_path: a policy file the test laid out itself (text is then unused).
        self.policy = policy_path or tmp / "policy.toml"
        if policy_path is None:
            self.policy.write_text(text)
        self.log = open(tmp / "gateway.log", "w+")
        e = dict(os.environ)
        e.update(env or {})
        e.setdefault("RUST_LOG", "info")
        self.proc = subprocess.Popen([BIN, "serve", "--policy", str(self.policy), "--listen", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=e)
        line = ""
        deadline = time.time() + 180
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("approxy listening on "):
                break
            if self.proc.poll() is not None:
                break
        if not line.startswith("approxy listening on "):
            self.stop()
            self.log.seek(0)
            raise RuntimeError("gateway did not start:\n" + self.log.read()[-3000:])
        self.url = line.split()[-1]
        self.base_url = self.url + "/v1"

    def client(self, **kw):
        kw.setdefault("api_key", "unused")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 300)
        return openai.OpenAI(base_url=self.base_url, **kw)

    def logs(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        return stop_process(self.proc)


@pytest.fixture
def start_gateway(tmp_path_factory):
    started = []

    def start(text=None, env=None, policy_path=None):
        g = Gateway(tmp_path_factory.mktemp("gw"), text or policy_text(), env, policy_path)
        started.append(g)
        return g

    yield start
    for g in started:
        g.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    g = Gateway(tmp_path_factory.mktemp("gw"), policy_text())
    yield g
    g.stop()


class FaultProxy:
    """Forwards to the real target; after `fail_after` /completion calls answers them with
    HTTP 500 (mode "error") or holds them for `delay` seconds (mode "slow")."""

    def __init__(self, fail_after=0, mode="error", delay=5.0):
        self.fail_after, self.mode, self.delay = fail_after, mode, delay
        self.completions = 0
        # Headers of every POST, in order (what the gateway sent the target).
        self.post_headers = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _forward(self, body):
                req = urllib.request.Request(TARGET + self.path, data=body, method=self.command,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        data, status = r.read(), r.status
                except urllib.error.HTTPError as e:
                    data, status = e.read(), e.code
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                proxy.post_headers.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                if self.path.startswith("/completion"):
                    proxy.completions += 1
                    if proxy.completions > proxy.fail_after:
                        if proxy.mode == "slow":
                            time.sleep(proxy.delay)
                        else:
                            msg = b'{"error":"injected failure with secret-upstream-detail"}'
                            self.send_response(500)
                            self.send_header("Content-Length", str(len(msg)))
                            self.end_headers()
                            self.wfile.write(msg)
                            return
                self._forward(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def fault_proxy():
    made = []

    def make(**kw):
        p = FaultProxy(**kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def raw_post(url, path, body=None, content=None, headers=None, timeout=300):
    return httpx.post(url + path, json=body, content=content, headers=headers or {}, timeout=timeout)


def read_stream(stream):
    """The text, finish reason and usage of a streamed chat answer (openai client chunks)."""
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    return text, finish, usage


def approxy_usage(raw):
    """`usage.approxy` from a raw openai response."""
    return json.loads(raw.http_response.text)["usage"]["approxy"]


# Largest gap, in nats, between the target's top two tokens that still counts as a numerical tie
# (the same allowance as the Rust engine tests: a re-sent answer is computed as a prompt batch and
# rounds differently from the target's own token-by-token answer).
TIE_NATS = 0.1


def assert_same_up_to_a_tie(ours, direct, what):
    """`ours` is the target's own answer `direct` (a choice asked with logprobs and top_logprobs=2),
    except that from the first difference on they may part if the target's choice there was a
    numerical tie. A shorter answer that is the other's start is no difference."""
    theirs = direct.message.content
    if ours.startswith(theirs) or theirs.startswith(ours):
        return
    at = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    offset = 0
    for entry in direct.logprobs.content:
        if offset + len(entry.token) > at:
            top = sorted((t.logprob for t in entry.top_logprobs), reverse=True)
            gap = top[0] - top[1] if len(top) > 1 else None
            assert gap is not None and gap <= TIE_NATS, \
                f"{what}: differs at character {at} in {entry.token!r} without a tie (gap {gap}):\n{ours!r}\n{theirs!r}"
            print(f"{what}: a numerical tie at character {at} (gap {gap:.3f} nats); the answers part there")
            return
        offset += len(entry.token)
    raise AssertionError(f"{what}: no token of the target's answer covers character {at}")
