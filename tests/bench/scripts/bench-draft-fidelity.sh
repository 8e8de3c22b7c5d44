#!/usr/bin/env bash
# Reproduces the draft-fidelity table in tests/README.md (`approxy bench draft-fidelity`): sets up whatever
# is missing and the draft at other precisions (`approxy setup --draft-variants`: the conversion
# venv again, and about 5 GB of models built from the float32 checkpoint), takes the target's
# greedy answers to the calibration's held-out prompts, measures every variant (resumable; pass
# --fresh to start over), and rewrites the results section of tests/README.md (`approxy bench report`).
# Usage: ./tests/bench/scripts/bench-draft-fidelity.sh [--fresh] [--per-kind N] [--max-answer-tokens N]
export APPROXY_SETUP_ARGS="${APPROXY_SETUP_ARGS:---draft-variants}"
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
START=$(date +%s)
"$APPROXY" bench draft-fidelity "$@"
"$APPROXY" bench report
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
