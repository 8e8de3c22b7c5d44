#!/usr/bin/env python3
"""Memory per draft worker, for sizing containers (deploy/README.md, "Sizing").

Starts `approxy serve` with 0 (a passthrough-only policy, which loads no draft), 1 and 2 draft
workers in front of a running llama-server, has one client per worker send a short and a long
request, twice, and reports the gateway's resident memory (VmRSS) and its peak (VmHWM) from
/proc. Usage: deploy/sizing.py --target http://127.0.0.1:8081 [--approxy target/release/approxy]
"""
import argparse
import concurrent.futures
import json
import pathlib
import re
import subprocess
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]


def status(pid, key):
    text = pathlib.Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M)[1]) / 1024


def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def measure(approxy, target, workers):
    text = (REPO / "policies" / "default.toml").read_text()
    text = re.sub(r'^base_url = .*$', f'base_url = "{target}"', text, flags=re.M)
    # Memory is the measurement, not speed: a busy machine must not turn a slow call into a 504.
    text = re.sub(r'^timeout = .*$', 'timeout = "600s"', text, count=1, flags=re.M)
    if workers == 0:
        text = text.replace('mode = "approximate"', 'mode = "passthrough"')
    else:
        text = text.replace("workers = 1", f"workers = {workers}")
    with tempfile.TemporaryDirectory() as d:
        policy = pathlib.Path(d) / "policy.toml"
        policy.write_text(text)
        proc = subprocess.Popen([approxy, "serve", "--policy", policy, "--listen", "127.0.0.1:0"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = proc.stdout.readline()
            assert line.startswith("approxy listening on "), line
            url = line.split()[-1]
            idle = status(proc.pid, "VmRSS")
            # A long prompt (about 1,500 tokens) grows a worker's KV cache; a short one does not.
            long_prompt = "Summarise this log:\n" + "\n".join(f"line {i}: request served in {i % 97} ms" for i in range(150))

            def body(content):
                return {"model": "m", "max_tokens": 64, "temperature": 0, "messages": [{"role": "user", "content": content}]}

            def client(_):
                return [post(url, body(c)) for c in ["Write a haiku about rust.", long_prompt] * 2]

            t0 = time.time()
            with concurrent.futures.ThreadPoolExecutor(max(workers, 1)) as pool:
                answers = [a for batch in pool.map(client, range(max(workers, 1))) for a in batch]
            took = time.time() - t0
            tokens = sum(a["usage"]["completion_tokens"] for a in answers)
            return {"draft_workers": workers, "rss_idle_mib": round(idle), "rss_after_mib": round(status(proc.pid, "VmRSS")),
                    "rss_peak_mib": round(status(proc.pid, "VmHWM")), "requests": len(answers),
                    "completion_tokens": tokens, "seconds": round(took, 1)}
        finally:
            # A gateway that does not drain in time is killed (and reaped) rather than left running.
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--approxy", default=str(REPO / "target" / "release" / "approxy"))
    a = ap.parse_args()
    rows = [measure(a.approxy, a.target, w) for w in (0, 1, 2)]
    for r in rows:
        print(json.dumps(r))
    base = rows[0]["rss_peak_mib"]
    for r in rows[1:]:
        print(f"{r['draft_workers']} worker(s): peak {r['rss_peak_mib']} MiB, "
              f"{(r['rss_peak_mib'] - base) / r['draft_workers']:.0f} MiB per worker over the passthrough-only gateway")


if __name__ == "__main__":
    main()
