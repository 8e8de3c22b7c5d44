"""Observability: the alert rules pass promtool (syntax and their own unit tests), a real
Prometheus (Debian's, from the test set-up) scrapes a running approxy and finds
`approxy_tokens_total`, loads the rules, and every query of the Grafana dashboard runs."""
import json
import os
import pathlib
import socket
import subprocess
import time

import httpx
import pytest

from conftest import MODEL, REPO, policy_text, stop_process

PROMETHEUS = os.environ.get("APPROXY_PROMETHEUS_BIN")
PROMTOOL = os.environ.get("APPROXY_PROMTOOL_BIN")
RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "approxy-dashboard.json"

if not (PROMETHEUS and PROMTOOL):
    raise RuntimeError("APPROXY_PROMETHEUS_BIN / APPROXY_PROMTOOL_BIN are not set: run ./deploy/test-all.sh")


def test_promtool_accepts_the_rules_and_their_unit_tests():
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "4 rules found" in check.stdout
    unit = subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=RULES.parent, capture_output=True, text=True)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path):
    def start(scrape_url):
        host = scrape_url.split("//", 1)[1]
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {RULES}\n"
            f"scrape_configs:\n  - job_name: approxy\n    static_configs:\n      - targets: ['{host}']\n"
        )
        port = free_port()
        log = open(tmp_path / "prometheus.log", "w")
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(0.5)
        raise AssertionError("prometheus did not become ready")

    procs = []
    yield start
    for p in procs:
        stop_process(p)


def query(url, expr):
    r = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10).json()
    assert r["status"] == "success", (expr, r)
    return r["data"]["result"]


def test_a_real_prometheus_scrapes_approxy(start_gateway, prometheus):
    g = start_gateway(policy_text())
    r = g.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=8)
    assert r.usage.model_extra["approxy"]["mode"] == "approximate"
    url = prometheus(g.url)
    deadline = time.time() + 60
    found = []
    while time.time() < deadline and not found:
        found = query(url, "approxy_tokens_total")
        time.sleep(1)
    assert found, "Prometheus never saw approxy_tokens_total"
    assert {s["metric"]["source"] for s in found} <= {"draft", "target"}
    assert sum(float(s["value"][1]) for s in found) >= 1
    assert query(url, 'up{job="approxy"}')[0]["value"][1] == "1"
    # The rules loaded and evaluate without error.
    rules = httpx.get(url + "/api/v1/rules", timeout=10).json()["data"]["groups"][0]["rules"]
    assert len(rules) == 4 and all(r["health"] in ("ok", "unknown") for r in rules), rules
    # Every dashboard query runs, with Grafana's variables filled in as Grafana would.
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for e in exprs:
        e = e.replace("$instance", ".*").replace("$__rate_interval", "1m").replace("$__range", "1h")
        query(url, e)
    # The dashboard's gauges are there too, and the saturation the autoscaling component
    # (deploy/k8s/components/scale-on-saturation) reads is a share.
    assert query(url, "approxy_request_slots_free")
    # The budget guard's ledger of the model that answered (the default is priced by the
    # target's time).
    assert query(url, "approxy_budget_target_seconds")
    sat = query(url, "1 - approxy_draft_workers_idle / approxy_draft_workers")
    assert sat and 0 <= float(sat[0]["value"][1]) <= 1, sat


def test_the_clients_trace_context_reaches_every_target_call(start_gateway, fault_proxy):
    proxy = fault_proxy(fail_after=10**9)
    g = start_gateway(policy_text(base_url=proxy.url))
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    raw = g.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=8,
        extra_headers={"traceparent": tp, "tracestate": "vendor=1", "x-approxy-threshold": "1"})
    assert raw.headers["x-approxy-mode"] == "approximate"
    calls = [h for path, h in proxy.post_headers if path.startswith("/completion")]
    assert calls, proxy.post_headers
    assert all(h.get("traceparent") == tp and h.get("tracestate") == "vendor=1" for h in calls), calls
    # A malformed one is not forwarded.
    proxy.post_headers.clear()
    g.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a tree."}], max_tokens=4,
                                       extra_headers={"traceparent": "not-a-trace", "x-approxy-threshold": "1"})
    assert all("traceparent" not in h for _, h in proxy.post_headers), proxy.post_headers
