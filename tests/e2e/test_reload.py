"""Policy reload: a valid change applies atomically, an invalid one is refused and the old
policy stays; a request in flight finishes under the policy it started with."""
import os
import time

from conftest import MODEL, policy_text

MSG = [{"role": "user", "content": "Name a fruit."}]


def threshold_of(g):
    """The threshold a probe request ran under; None when it passed through (on a loaded
    machine the draft's admission may send a probe beside an open stream there), which says
    nothing about the policy, so a wait goes on."""
    raw = g.client().chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=2)
    t = raw.headers.get("x-approxy-threshold")
    return None if t is None else float(t)


def wait_for(pred, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.5)
    return False


def test_valid_then_invalid_reload(start_gateway):
    # Two draft workers: the probe requests must not be pushed to passthrough by the open stream.
    g = start_gateway(policy_text(workers="2"))
    assert threshold_of(g) == 0.9
    # A stream started under the old policy...
    stream = g.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to fifty."}], max_tokens=60, stream=True)
    assert float(stream.headers["x-approxy-threshold"]) == 0.9
    g.policy.write_text(policy_text(workers="2", threshold="0.3"))
    assert wait_for(lambda: threshold_of(g) == 0.3), g.logs()[-2000:]
    # ...finished normally.
    chunks = list(stream.parse())
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    # An invalid file is rejected and the running policy stays.
    g.policy.write_text(policy_text(workers="2", threshold="7.5"))
    assert wait_for(lambda: "new policy rejected" in g.logs())
    assert threshold_of(g) == 0.3
    assert g.proc.poll() is None


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def mode_of(g):
    raw = g.client().chat.completions.with_raw_response.create(model=MODEL, messages=MSG, max_tokens=2)
    return raw.headers["x-approxy-mode"]


def test_a_passthrough_only_policy_loads_no_draft_until_a_reload_needs_it(start_gateway):
    import httpx

    g = start_gateway(policy_text(mode='"passthrough"'))
    ready = httpx.get(g.url + "/ready", timeout=30)
    assert ready.status_code == 200, ready.text
    assert ready.json()["draft_loaded"] is False
    assert mode_of(g) == "passthrough"
    # One draft worker holds the int4 weights (about 550 MiB on this model): none are here.
    before = rss_mib(g.proc.pid)
    assert before < 300, f"{before:.0f} MiB without a draft loaded"
    # A reload that adds an approximate model loads the draft before the new policy serves.
    g.policy.write_text(policy_text())
    assert wait_for(lambda: "policy reloaded" in g.logs(), timeout=120), g.logs()[-2000:]
    assert httpx.get(g.url + "/ready", timeout=30).json()["draft_loaded"] is True
    assert mode_of(g) == "approximate"
    assert rss_mib(g.proc.pid) > before + 200


def test_a_kubernetes_configmap_update_is_reloaded(start_gateway, tmp_path):
    """The kubelet updates a mounted ConfigMap the way its atomic writer does: approxy.toml is a
    symlink to ..data/approxy.toml, ..data a symlink to a timestamped directory, and an update
    writes a new directory and renames a new ..data over the old one. The file's own inode
    never changes, so this is what deploy/k8s relies on for reloads without a restart."""
    mount = tmp_path / "etc-approxy"
    mount.mkdir()

    def publish(text, version):
        d = mount / f"..2026_11_23_{version}"
        d.mkdir()
        (d / "approxy.toml").write_text(text)
        tmp_link = mount / "..data_tmp"
        tmp_link.symlink_to(d.name)
        os.replace(tmp_link, mount / "..data")

    publish(policy_text(threshold="0.7"), 1)
    (mount / "approxy.toml").symlink_to("..data/approxy.toml")
    g = start_gateway(policy_path=mount / "approxy.toml")
    assert threshold_of(g) == 0.7
    publish(policy_text(threshold="0.4"), 2)
    assert wait_for(lambda: threshold_of(g) == 0.4), g.logs()[-2000:]
    # A broken update is refused like any invalid file; the running policy stays.
    publish(policy_text(threshold="7.5"), 3)
    assert wait_for(lambda: "new policy rejected" in g.logs())
    assert threshold_of(g) == 0.4
