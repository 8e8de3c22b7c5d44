#!/usr/bin/env bash
# Importance labels on HumanEval (AutoJudge's, the problems' tests as the judge): sets up whatever
# is missing, starts the local llama-server target, and labels (`approxy train importance`,
# resumable, shards of 8 problems written whole into training/data/importance/): the training
# problems along the target's answers, then the held-out ones, then both along approxy's live
# answers at THRESHOLD (default 0.85, the default policy's code threshold). Hours on 2 cores.
# Usage: ./deploy/label-importance.sh [THRESHOLD]
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
THRESHOLD="${1:-0.85}"
OUT="$REPO/training/data/importance"
mkdir -p "$APPROXY_HOME/logs"
PORT="$(free_port)"
echo "==> starting llama-server (target) on 127.0.0.1:$PORT"
start_target "$PORT" "$APPROXY_HOME/logs/label-target-server.log"
trap 'stop_processes "$TARGET_PID"' EXIT
URL="http://127.0.0.1:$PORT"
for args in "" "--held-out" "--live-threshold $THRESHOLD" "--live-threshold $THRESHOLD --held-out"; do
  START=$(date +%s)
  # shellcheck disable=SC2086
  "$APPROXY" train importance --target-url "$URL" --out "$OUT" $args
  echo "==> labels ${args:-along the target's answers} in $(( $(date +%s) - START ))s on $(nproc) cores, $(date -u +%Y-%m-%d)"
done
