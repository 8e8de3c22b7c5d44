#!/usr/bin/env bash
# Reproduces the committed default verifier from scratch: sets up whatever is missing, starts
# the local llama-server target, collects labels (`approxy train collect`, resumable), then fits
# and calibrates (`approxy train fit`), writing policies/verifier/{default.json,calibration.json,report.md}.
# Usage: ./deploy/train-default.sh [PROMPTS] [MAX_ANSWER_TOKENS]
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
PROMPTS="${1:-200}"
MAX_ANSWER="${2:-48}"
mkdir -p "$APPROXY_HOME/logs"
DATA="$APPROXY_HOME/training/rows-p${PROMPTS}-m${MAX_ANSWER}"
PORT="$(free_port)"
echo "==> starting llama-server (target) on 127.0.0.1:$PORT"
start_target "$PORT" "$APPROXY_HOME/logs/train-target-server.log"
trap 'kill -TERM "$TARGET_PID" 2>/dev/null; wait "$TARGET_PID" 2>/dev/null || true' EXIT
START=$(date +%s)
"$APPROXY" train collect --target-url "http://127.0.0.1:$PORT" --data "$DATA" --prompts "$PROMPTS" --max-answer-tokens "$MAX_ANSWER"
"$APPROXY" train fit --data "$DATA" --out-dir "$REPO/policies/verifier" --seed 7
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
