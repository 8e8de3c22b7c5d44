#!/usr/bin/env bash
# Reproduces the committed default verifier from scratch: sets up whatever is missing, starts
# the local llama-server target, collects labels (`approxy train collect`, resumable): teacher-
# forced rows on PROMPTS prompts (half code, half chat, each from its kind's sources in turn:
# training/scripts/build_corpus.py), then rows along live decodes (the decode loop at the default
# policy's threshold) on LIVE_PROMPTS of them; then fits and calibrates (`approxy train fit`),
# writing policies/verifier/{default.json,calibration.json,report.md,roc.png,thresholds.png}.
# Usage: ./training/scripts/train-default.sh [PROMPTS] [MAX_ANSWER_TOKENS] [LIVE_PROMPTS]
source "$(dirname "${BASH_SOURCE[0]}")/../../deploy/bootstrap.sh"
PROMPTS="${1:-300}"
MAX_ANSWER="${2:-48}"
LIVE_PROMPTS="${3:-100}"
mkdir -p "$APPROXY_HOME/logs"
# v2: rows with the answer's context (older shards are refused by `train fit`); one directory per
# conversion of the draft (rows record it, and collect refuses to mix two); "s" since collect
# takes each kind's sources in turn (earlier directories hold the first prompts of each kind).
BUILD="$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print("-".join([m.get("precision", "int4")] + m.get("extra_options", [])).replace("=", ""))' "$APPROXY_HOME/models/draft-onnx/approxy_draft.json")"
DATA="$APPROXY_HOME/training/rows-v2-${BUILD}-s-p${PROMPTS}-m${MAX_ANSWER}-l${LIVE_PROMPTS}"
PORT="$(free_port)"
echo "==> starting llama-server (target) on 127.0.0.1:$PORT"
start_target "$PORT" "$APPROXY_HOME/logs/train-target-server.log"
trap 'stop_processes "$TARGET_PID"' EXIT
START=$(date +%s)
"$APPROXY" train collect --target-url "http://127.0.0.1:$PORT" --data "$DATA" --prompts "$PROMPTS" --max-answer-tokens "$MAX_ANSWER"
echo "==> teacher-forced rows in $(( $(date +%s) - START ))s"
"$APPROXY" train collect --target-url "http://127.0.0.1:$PORT" --data "$DATA" --prompts "$LIVE_PROMPTS" --max-answer-tokens "$MAX_ANSWER" --live-threshold 0.7
echo "==> live rows done at $(( $(date +%s) - START ))s"
"$APPROXY" train fit --data "$DATA" --out-dir "$REPO/policies/verifier" --seed 7
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
