#!/usr/bin/env bash
# What a span's calls ask for on llama-server (tests/README.md, "What a span's calls ask for"):
# the shipped policy, whose spans ask each call for the fewest tokens that could end them,
# against the same policy with one streamed call a span, closed where the span ends
# (`default-streamed`), and target-only, on the HumanEval sample (pass@1; 256 tokens at most),
# cores pinned (llama-server on core 0, draft and gateway on core 1). The report carries the
# target's busy time by its own counters. Resumable (saved runs are reused; pass --fresh to start
# over).
# Usage: [PROBLEMS=16] ./tests/bench/scripts/bench-span-ask.sh [--fresh]
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
PROBLEMS="${PROBLEMS:-16}"
START=$(date +%s)
OUT="$REPO/tests/bench/results/calls-span-ask"
"$APPROXY" bench calls --layouts pinned --target-delay 0 --sample humaneval --prompts "$PROBLEMS" \
  --max-tokens 256 --only target-only,default,default-streamed --out "$OUT" "$@"
"$APPROXY" bench report
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
