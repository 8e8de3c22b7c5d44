"""deploy/run-local.sh stops what it started even when the target ignores SIGTERM (as
llama-server did, hung in "cleaning up before exit..." after a long run), and the script exits.

The script runs for real, from a copy of deploy/ in a scratch repository where its set-up is
stood in for: `cargo` and `curl` on PATH succeed without doing anything (no build; the target is
"healthy" at once), target/release/approxy answers `setup` and serves nothing until SIGINT or
SIGTERM, and $APPROXY_HOME/bin/llama-server ignores both. No model, port or build is needed."""
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

from conftest import REPO

GRACE = 2

STANDIN_TARGET = f"""#!{sys.executable}
import os, signal, sys, time
def hang(*_):
    print("cleaning up before exit...", flush=True)
signal.signal(signal.SIGTERM, hang)
signal.signal(signal.SIGINT, hang)
open(os.environ["STANDIN_DIR"] + "/target.pid", "w").write(str(os.getpid()))
time.sleep(120)  # the test's own limit, should the script never kill it
"""

# approxy drains and exits 0 on either signal.
STANDIN_APPROXY = f"""#!{sys.executable}
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
if sys.argv[1] == "serve":
    open(os.environ["STANDIN_DIR"] + "/approxy.pid", "w").write(str(os.getpid()))
    time.sleep(120)
"""


def executable(path: pathlib.Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def runs(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it has exited, and its reaper is init once the
    script is gone)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def gone(pid: int, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while runs(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def run_local(tmp_path):
    """Starts the copied run-local.sh with the stand-ins (grace: APPROXY_STOP_GRACE) and waits
    until both stand-ins run; returns the script's process and their pids."""
    repo = tmp_path / "repo"
    (repo / "deploy").mkdir(parents=True)
    for script in (REPO / "deploy").glob("*.sh"):
        shutil.copy2(script, repo / "deploy")
    home = tmp_path / "home"
    executable(home / "bin" / "llama-server", STANDIN_TARGET)
    executable(repo / "target" / "release" / "approxy", STANDIN_APPROXY)
    for tool in ("cargo", "curl"):
        executable(tmp_path / "bin" / tool, "#!/bin/sh\nexit 0\n")
    started = []

    def start(grace):
        env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", APPROXY_HOME=str(home),
                   APPROXY_STOP_GRACE=str(grace), STANDIN_DIR=str(tmp_path))
        log = open(tmp_path / "run-local.log", "w+")
        # SIGINT as a terminal's shell leaves it: run by a shell without job control (CI's, in
        # the background) pytest inherits SIGINT ignored and so would the script, and bash cannot
        # trap a signal ignored on entry (the Ctrl-C tests failed so, exit 0 and a timeout).
        proc = subprocess.Popen(["bash", str(repo / "deploy" / "run-local.sh")], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        started.append(proc)
        deadline = time.monotonic() + 30
        while not (tmp_path / "approxy.pid").exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run-local.log").read_text()
            time.sleep(0.05)
        time.sleep(0.2)  # until run-local.sh has recorded approxy's pid
        pids = {name: int((tmp_path / f"{name}.pid").read_text()) for name in ("target", "approxy")}
        return proc, pids, log

    yield start
    # Whatever a failed test left behind: the stand-ins share the script's process group.
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_run_kills_a_target_that_ignores_sigterm(run_local, how):
    proc, pids, log = run_local(GRACE)
    interrupted = time.monotonic()
    if how == "ctrl-c":
        # As a terminal sends it: to the whole foreground process group, servers included.
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=GRACE + 5)
    except subprocess.TimeoutExpired:
        log.seek(0)
        pytest.fail(f"run-local.sh still runs {GRACE + 5} s after {how} (grace {GRACE} s):\n{log.read()}")
    took = time.monotonic() - interrupted
    assert code == (130 if how == "ctrl-c" else 143), code
    assert gone(pids["target"]), "the target outlived run-local.sh"
    assert gone(pids["approxy"]), "approxy outlived run-local.sh"
    print(f"run-local.sh exited {code} {took:.1f} s after {how} (grace {GRACE} s)")


def test_a_second_signal_while_stopping_kills_the_target_at_once(run_local):
    # A grace the test does not wait out: the second signal must end it.
    proc, pids, log = run_local(60)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    assert proc.poll() is None and runs(pids["target"]), "the target was not given its grace"
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.seek(0)
        pytest.fail(f"run-local.sh still runs 5 s after a second signal:\n{log.read()}")
    assert code == 143, code
    assert gone(pids["target"]), "the second signal ended run-local.sh and left the target running"
