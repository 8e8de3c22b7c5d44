#!/usr/bin/env bash
# Structured output (tests/README.md, "Structured output"): the hand-written sample in
# tests/bench/structured/ (extraction and classification under JSON Schemas, JSON mode, tool calls) through
# the shipped policy and through target-only, one llama-server, cores pinned; then what
# compiling a schema costs. Writes tests/bench/results/structured/.
# Usage: ./tests/bench/scripts/bench-structured.sh [--prompts N]
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
START=$(date +%s)
"$APPROXY" bench structured --out "$REPO/tests/bench/results/structured" "$@"
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
