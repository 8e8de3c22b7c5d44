#!/usr/bin/env bash
# Importance labels (AutoJudge's): sets up whatever is missing, starts the local llama-server
# target, and labels in resumable shards written whole (`approxy train importance`). Hours on
# 2 cores; rerun to resume.
#
# Code (default): HumanEval, the problems' tests as the judge, shards of 8 problems in
# training/data/importance/: the training problems along the target's answers, then the
# held-out ones, then both along approxy's live answers at THRESHOLD (default 0.85, the
# default policy's code threshold).
#
# Chat (`chat`): along the target's answers, IFEval's checkers and the target's likelihood as
# the judges, shards of 4 prompts in training/data/importance-chat/: the instruction-following
# set's first 20 prompts (held out), its other 20 (training), then TRAIN of the corpus's chat
# prompts (default 32; the likelihood alone judges them).
# Usage: ./training/scripts/label-importance.sh [THRESHOLD]
#        ./training/scripts/label-importance.sh chat [TRAIN]
source "$(dirname "${BASH_SOURCE[0]}")/../../deploy/bootstrap.sh"
mkdir -p "$APPROXY_HOME/logs"
PORT="$(free_port)"
echo "==> starting llama-server (target) on 127.0.0.1:$PORT"
start_target "$PORT" "$APPROXY_HOME/logs/label-target-server.log"
trap 'stop_processes "$TARGET_PID"' EXIT
URL="http://127.0.0.1:$PORT"
labels() {
  local started
  started=$(date +%s)
  "$APPROXY" train importance --target-url "$URL" "$@"
  echo "==> labels ($*) in $(( $(date +%s) - started ))s on $(nproc) cores, $(date -u +%Y-%m-%d)"
}
if [ "${1:-}" = chat ]; then
  labels --chat --shard-problems 4 --held-out
  labels --chat --shard-problems 4 --instructions
  labels --chat --shard-problems 4 --chat-prompts "${2:-32}"
  exit 0
fi
THRESHOLD="${1:-0.85}"
OUT="$REPO/training/data/importance"
for args in "" "--held-out" "--live-threshold $THRESHOLD" "--live-threshold $THRESHOLD --held-out"; do
  # shellcheck disable=SC2086
  labels --out "$OUT" $args
done
