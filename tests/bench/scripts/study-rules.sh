#!/usr/bin/env bash
# Reproduces the acceptance-rule study in tests/README.md ("Choosing the acceptance rule"): sets up whatever
# is missing, collects teacher-forced rows with the target's top-20 probabilities (the rows
# train-default.sh starts with, in the same directory; resumable), fits and calibrates the
# verifier for identity (tests/bench/results/acceptance-rules/) and each other rule (`approxy train fit
# --rule`, into tests/bench/results/acceptance-rules/by-rule/<rule>/), then runs the oracle (`approxy bench oracle`):
# each rule with the target's own probabilities as the verifier, and the draft's confidence at the
# shipped threshold (0.7), one step either side of it (0.85 on code, where the shipped threshold
# loses problems; 0.6 on chat and instructions, where it leaves the target the most) and at the
# thresholds ratio:0.5's calibration gives at a 5 % budget, on
# HumanEval, held-out chat and the instruction-following set (the sizes measured in tests/README.md;
# a fresh configuration costs about 0.15 s per token on 2 cores). Target answers are kept under
# $APPROXY_HOME/work/bench-oracle-asked, so a rerun asks the target only where it was not asked.
# ORACLE_ONLY=1 skips the collection and the fits and runs the oracle with the committed
# calibrations (tests/bench/results/acceptance-rules/by-rule/).
# Usage: [PROBLEMS=24] [CHAT=40] [INSTRUCTIONS=40] [ORACLE_ONLY=1] ./tests/bench/scripts/study-rules.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
PROBLEMS="${PROBLEMS:-24}"
CHAT="${CHAT:-40}"
INSTRUCTIONS="${INSTRUCTIONS:-40}"
PROMPTS=300
MAX_ANSWER=48
LIVE_PROMPTS=100
RULES=(ratio:0.8 ratio:0.5 ratio:0.2 "typical:0.09,0.3" sprinter)
mkdir -p "$APPROXY_HOME/logs"
BUILD="$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print("-".join([m.get("precision", "int4")] + m.get("extra_options", [])).replace("=", ""))' "$APPROXY_HOME/models/draft-onnx/approxy_draft.json")"
DATA="$APPROXY_HOME/training/rows-v2-${BUILD}-s-p${PROMPTS}-m${MAX_ANSWER}-l${LIVE_PROMPTS}"
START=$(date +%s)
OUT="$REPO/tests/bench/results/acceptance-rules/by-rule"
if [ "${ORACLE_ONLY:-0}" != 1 ]; then
PORT="$(free_port)"
echo "==> starting llama-server (target) on 127.0.0.1:$PORT"
start_target "$PORT" "$APPROXY_HOME/logs/study-target-server.log"
trap 'stop_processes "$TARGET_PID"' EXIT
"$APPROXY" train collect --target-url "http://127.0.0.1:$PORT" --data "$DATA" --prompts "$PROMPTS" --max-answer-tokens "$MAX_ANSWER"
# Cleared once stopped: the exit trap must not signal a pid that may have been reused.
stop_process "$TARGET_PID"; TARGET_PID=""
echo "==> rows ready at $(( $(date +%s) - START ))s"
# Identity (with the table of what every rule accepts), then each other rule.
"$APPROXY" train fit --data "$DATA" --out-dir "$REPO/tests/bench/results/acceptance-rules" --seed 7
for rule in "${RULES[@]}"; do
  name="$(echo "$rule" | tr ':,' '__')"
  "$APPROXY" train fit --data "$DATA" --rule "$rule" --out-dir "$OUT/$name" --seed 7
done
echo "==> calibrated every rule at $(( $(date +%s) - START ))s"
fi
# One run per kind (code, chat, instructions), each with its own results directory; target answers
# are shared through the cache, so the order does not matter.
V50="$OUT/ratio_0.5/calibration.json@0.05"
R="$REPO/tests/bench/results/oracle"
"$APPROXY" bench oracle --problems "$PROBLEMS" --chat 0 --instructions 0 \
  --rules "identical,ratio:0.8,ratio:0.5,ratio:0.2" --verifiers "confidence:0.7,confidence:0.85,$V50" --out "$R/code"
"$APPROXY" bench oracle --problems 0 --chat "$CHAT" --instructions 0 \
  --rules "identical,ratio:0.8,ratio:0.5" --verifiers "confidence:0.6,confidence:0.7,$V50" --out "$R/chat"
"$APPROXY" bench oracle --problems 0 --chat 0 --instructions "$INSTRUCTIONS" \
  --rules "identical,ratio:0.8,ratio:0.5" --verifiers "confidence:0.6,confidence:0.7" --out "$R/instructions"
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
