#!/usr/bin/env python3
"""Runaway answers in `approxy bench calls` runs (tests/README.md, "Runaway loops"): of a
configuration's answers, those cut by `max_tokens` where target-only's answer to the same prompt
stopped by itself. Usage: tests/bench/scripts/loops_count.py RAW_DIR [CONFIG ...] (RAW_DIR holds the runs'
`*-target-only.json` and `*-CONFIG.json`; CONFIG defaults to `default`).
"""
import json
import pathlib
import sys


def finishes(path):
    runs = json.loads(path.read_text())
    return {p["id"]: p["generation"] for p in runs["prompts"]}


def main():
    raw = pathlib.Path(sys.argv[1])
    configs = sys.argv[2:] or ["default"]
    (target_file,) = raw.glob("*-target-only.json")
    target = finishes(target_file)
    cut = sum(g["finish_reason"] == "length" for g in target.values())
    print(f"target-only: {cut} of {len(target)} answers cut by max_tokens")
    for config in configs:
        (path,) = raw.glob(f"*-{config}.json")
        answers = finishes(path)
        cut = [i for i, g in answers.items() if g["finish_reason"] == "length"]
        runaway = [i for i in cut if target.get(i, {}).get("finish_reason") == "stop"]
        print(f"{config}: {len(cut)} of {len(answers)} cut by max_tokens; where target-only stopped: "
              f"{len(runaway)} {runaway}")


if __name__ == "__main__":
    main()
