#!/usr/bin/env bash
# Runaway loops (tests/README.md, "Runaway loops"): the 40 instruction prompts at 256 tokens, cores
# pinned, target-only and the shipped policy; then the answers cut by max_tokens where target-only
# stopped. Writes tests/bench/results/loops/after (for the "before" column, run it at a commit
# before the loop watch with OUT=tests/bench/results/loops/before).
# Usage: [OUT=tests/bench/results/loops/after] ./tests/bench/scripts/bench-loops.sh [--fresh]
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
OUT="${OUT:-$REPO/tests/bench/results/loops/after}"
START=$(date +%s)
"$APPROXY" bench calls --sample instructions --prompts 40 --max-tokens 256 --layouts pinned \
  --only target-only,default --out "$OUT" "$@"
python3 "$REPO/tests/bench/scripts/loops_count.py" "$OUT/raw" default
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
