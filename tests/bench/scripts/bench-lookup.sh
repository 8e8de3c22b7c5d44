#!/usr/bin/env bash
# Prompt lookup (tests/README.md, "Prompt lookup"): the shipped policy with and without prompt
# lookup (8 tokens), against target-only, on the copy-heavy sample (tests/bench/copy/: 16
# functions rewritten with one small change, 8 passages quoted; answers compared with
# target-only's and with the default's), then on the 24-problem HumanEval sample (pass@1), where
# answers copy less. Cores pinned (llama-server on core 0, draft and gateway on core 1). Each run
# is resumable (saved runs are reused; pass --fresh to start over).
# Usage: [COPY=24] [PROBLEMS=24] ./tests/bench/scripts/bench-lookup.sh [--fresh]
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
COPY="${COPY:-24}"
PROBLEMS="${PROBLEMS:-24}"
START=$(date +%s)
OUT="$REPO/tests/bench/results/calls-lookup"
run() { "$APPROXY" bench calls --layouts pinned --target-delay 0 --only target-only,default,default-lookup --out "$OUT" "$@"; }
run --sample copy --prompts "$COPY" --max-tokens 256 "$@"
run --sample humaneval --prompts "$PROBLEMS" "$@"
"$APPROXY" bench report
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
