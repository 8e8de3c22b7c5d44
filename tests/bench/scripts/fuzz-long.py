#!/usr/bin/env python3
"""Long property-based fuzzing runs: each property gets a CPU-time budget.

Every property test in the repo runs a fixed number of cases in the normal test command. This
runs each one again and again, each round with a fresh random seed (proptest's default), until
the property has used `--cpu-minutes` of CPU. CPU time rather than wall time, so that the budget
means the same whatever else the machine is doing. Properties run in `--lanes` parallel lanes.

    tests/bench/scripts/fuzz-long.py --cpu-minutes 30 --lanes 2 --out tests/bench/results/fuzz-long.json

A failing round stops that property; its output is kept in the report. Exit status 1 when any
property failed.
"""

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# (what the issue calls it, cargo package, test name)
PROPERTIES = [
    ("request parser", "approxy-gateway", "request::properties::any_body_parses_or_names_a_field"),
    ("policy parser", "approxy-gateway", "policy::properties::any_policy_text_loads_or_says_why"),
    ("stop matcher", "approxy-verifier", "stop::properties::streamed_matching_equals_matching_the_whole_text"),
    ("UTF-8 stream decoder", "approxy-verifier", "tokenizer::properties::streamed_decoding_gives_back_the_text"),
    ("passthrough path guard", "approxy-gateway", "passthrough::properties::an_allowed_path_never_leaves_the_api_prefix"),
    ("piecewise re-tokenization", "approxy-verifier", "tokenizer::properties::retokenized_pieces_give_back_the_text"),
]

FEATURES = {"approxy-verifier": ["--features", "approxy-verifier/testing"]}


def test_binary(package: str) -> str:
    """Builds the package's lib tests in release and returns the executable's path."""
    cmd = ["cargo", "test", "--release", "-p", package, *FEATURES.get(package, []), "--lib", "--no-run", "--message-format=json"]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["kind"] == ["lib"]:
            return msg["executable"]
    raise SystemExit(f"no test executable for {package}")


def run_round(binary: str, test: str, env: dict) -> tuple[bool, float, str]:
    """One process: passed, the CPU seconds it used (its own rusage, so lanes do not mix), output."""
    with tempfile.TemporaryFile(mode="w+") as log:
        p = subprocess.Popen([binary, test, "--exact", "--test-threads=1"], env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        out = log.read()
    return p.returncode == 0 and "1 passed" in out, ru.ru_utime + ru.ru_stime, out


def run_property(name: str, binary: str, test: str, budget_s: float, cases_per_round: int) -> dict:
    used, rounds, started = 0.0, 0, time.monotonic()
    env = dict(os.environ, PROPTEST_CASES=str(cases_per_round))
    result = {"property": name, "test": test, "ok": True}
    while used < budget_s:
        ok, cpu, out = run_round(binary, test, env)
        rounds += 1
        used += cpu
        if not ok:
            result.update(ok=False, failure=out[-4000:])
            break
    passed = rounds if result["ok"] else rounds - 1
    result.update(rounds=rounds, cases=passed * cases_per_round, cpu_seconds=round(used, 1), wall_seconds=round(time.monotonic() - started, 1))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-minutes", type=float, default=30.0)
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--cases-per-round", type=int, default=5000)
    ap.add_argument("--only", action="append", help="run only properties whose name contains this")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    props = [p for p in PROPERTIES if not a.only or any(o in p[0] for o in a.only)]
    # Copied out of target/: a build during the run must not swap the binary under a lane.
    keep = Path(tempfile.mkdtemp(prefix="approxy-fuzz-"))
    binaries = {}
    for pkg in sorted({p[1] for p in props}):
        binaries[pkg] = str(shutil.copy2(test_binary(pkg), keep / pkg))
    budget = a.cpu_minutes * 60
    started = time.time()
    results = []

    def write_report() -> None:
        # After every property, so that a run cut short keeps what it finished.
        if not a.out:
            return
        report = {
            "command": " ".join(["tests/bench/scripts/fuzz-long.py", *sys.argv[1:]]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor()),
            "cores": os.cpu_count(),
            "cpu_minutes_per_property": a.cpu_minutes,
            "results": results,
        }
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=2) + "\n")

    with concurrent.futures.ThreadPoolExecutor(max_workers=a.lanes) as pool:
        futures = [pool.submit(run_property, name, binaries[pkg], test, budget, a.cases_per_round) for name, pkg, test in props]
        for f in concurrent.futures.as_completed(futures):
            r = f.result()
            results.append(r)
            write_report()
            print(f"{r['property']}: {'ok' if r['ok'] else 'FAILED'}, {r['cases']} cases, {r['cpu_seconds']} CPU s, {r['wall_seconds']} s", flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
