#!/usr/bin/env python3
"""Compares two `approxy bench quality` result directories problem by problem.

    tests/bench/scripts/compare-runs.py tests/bench/results /tmp/new-results

For each configuration both hold (raw/<layout>-<config>.json): how many answers are
identical text, how many have the same verdict and the same number of target calls, and
the summary figures side by side. Greedy decoding makes the draft's answers reproducible
exactly; the target's (llama.cpp) can differ in a few tokens between CPUs and builds.
"""
import json
import pathlib
import sys


def load(d, name):
    return json.loads((pathlib.Path(d) / "raw" / name).read_text())


def main(old, new):
    names = sorted(p.name for p in (pathlib.Path(new) / "raw").glob("*.json") if (pathlib.Path(old) / "raw" / p.name).exists())
    print("| run | same text | same verdict | same target calls | pass@1 | tokens/s | target calls per 100 tokens |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        a, b = load(old, name), load(new, name)
        pa = {p["task_id"]: p for p in a["problems"]}
        pb = {p["task_id"]: p for p in b["problems"]}
        common = [t for t in pa if t in pb]
        calls = lambda p: (p["generation"].get("approxy") or {}).get("target_calls")
        text = sum(pa[t]["generation"]["text"] == pb[t]["generation"]["text"] for t in common)
        verdict = sum(pa[t]["verdict"] == pb[t]["verdict"] for t in common)
        same_calls = sum(calls(pa[t]) == calls(pb[t]) for t in common)
        sa, sb = a["summary"], b["summary"]
        n = len(common)
        print(f"| {name[:-5]} | {text}/{n} | {verdict}/{n} | {same_calls}/{n} | {sa['pass_at_1']:.1f} → {sb['pass_at_1']:.1f} "
              f"| {sa['tokens_per_second']:.1f} → {sb['tokens_per_second']:.1f} | {sa['target_calls_per_100']:.2f} → {sb['target_calls_per_100']:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
