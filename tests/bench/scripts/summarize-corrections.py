#!/usr/bin/env python3
"""The table behind the default correction: one row per setting that
tests/bench/scripts/bench-corrections.sh ran (its results directory as the argument)."""
import json
import pathlib
import sys


def main(out):
    print("| setting | pass@1 | target calls per 100 tokens | target tokens per 100 | cost, cache prices (USD) | cost, no cache (USD) |")
    print("|---|---|---|---|---|---|")
    for d in sorted(pathlib.Path(out).iterdir()):
        f = d / "raw" / "shared-confidence-default.json"
        if not f.exists():
            f = d / "raw" / "shared-target-only.json"
        if not f.exists():
            continue
        s = json.loads(f.read_text())["summary"]
        print(f"| {d.name} | {s['pass_at_1']:.1f} | {s['target_calls_per_100']:.2f} | {s['target_tokens_per_100']:.1f} "
              f"| {s['cost_usd_cached']:.4f} | {s['cost_usd']:.4f} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
