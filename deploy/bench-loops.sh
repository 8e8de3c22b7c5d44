#!/usr/bin/env bash
# Runaway loops (tests/README.md, "Runaway loops"): the 40 instruction prompts at 256 tokens, cores
# pinned, target-only and the shipped policy; then the answers cut by max_tokens where target-only
# stopped. Writes deploy/results/loops/after (for the "before" column, run it at a commit
# before the loop watch with OUT=deploy/results/loops/before).
# Usage: [OUT=deploy/results/loops/after] ./deploy/bench-loops.sh [--fresh]
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
OUT="${OUT:-$REPO/deploy/results/loops/after}"
START=$(date +%s)
"$APPROXY" bench calls --sample instructions --prompts 40 --max-tokens 256 --layouts pinned \
  --only target-only,default --out "$OUT" "$@"
python3 "$REPO/deploy/loops_count.py" "$OUT/raw" default
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
